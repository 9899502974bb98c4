package promtest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// InterfaceLintFindings are the Prometheus lint findings ("metric: text")
// forced by the interface we keep: the Rust exporter's `*_bucket_total`
// counter families carry `le`. The same data is also exported as native
// histograms.
var InterfaceLintFindings = []string{
	`profi_cuda_duration_bucket_total: non-histogram metrics should not have "le" label`,
}

// CheckPromtool runs `promtool check metrics` (the real Prometheus linter)
// on an exposition and fails on a parse error or on any finding not in
// InterfaceLintFindings. Without promtool it skips, or fails under
// PROFI_E2E=1.
func CheckPromtool(tb testing.TB, exposition []byte) {
	tb.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			tb.Fatal("promtool not found (Debian package prometheus)")
		}
		tb.Skip("promtool not found (Debian package prometheus)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == 3: // lint findings only
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			line = strings.TrimSpace(line)
			if f := strings.Replace(line, " ", ": ", 1); !slices.Contains(InterfaceLintFindings, f) {
				tb.Errorf("promtool finding not forced by the interface: %s", line)
			}
		}
	default:
		tb.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
