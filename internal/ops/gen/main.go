// Command gen writes the files generated from the operation table:
// bpf/ops.h, the Go constants and the probe table of docs/PROBES.md.
// Run by `go generate ./internal/ops` from that directory.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/profi-dev/profi/internal/ops"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ops/gen:", err)
		os.Exit(1)
	}
}

func run() error {
	if err := os.WriteFile(ops.HeaderPath, []byte(ops.CHeader()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(ops.ConstsPath, []byte(ops.GoConsts()), 0o644); err != nil {
		return err
	}
	doc, err := os.ReadFile(ops.DocPath)
	if err != nil {
		return err
	}
	updated, err := ops.SpliceDoc(string(doc))
	if err != nil {
		return fmt.Errorf("%s: %w", ops.DocPath, err)
	}
	if updated == string(doc) {
		return nil
	}
	return os.WriteFile(ops.DocPath, []byte(strings.TrimRight(updated, "\n")+"\n"), 0o644)
}
