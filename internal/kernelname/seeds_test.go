package kernelname

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the committed fuzz seed corpus in testdata/fuzz")

// maxSeedNameLen keeps long Normalize cases out of the committed corpus;
// FuzzNormalize adds every case with f.Add anyway.
const maxSeedNameLen = 300

// committedSeeds are the generated files of testdata/fuzz: each fuzz
// target's seeds by file name, in the corpus file format.
func committedSeeds() map[string]map[string]string {
	syms := map[string]string{
		"tiny-symtab": corpusBytes(tinyELF(tinyOpts{})),
		"tiny-dynsym": corpusBytes(tinyELF(tinyOpts{dynsym: true})),
	}
	// The other corrupt variants are only f.Add'ed, to keep the
	// committed corpus small.
	corrupt := corruptSeeds(tinyELF(tinyOpts{}))
	for _, name := range []string{"truncated", "magic-only", "elf32-header"} {
		syms["tiny-"+name] = corpusBytes(corrupt[name])
	}
	norm := map[string]string{}
	for _, tc := range normalizeCases {
		if len(tc.raw) <= maxSeedNameLen {
			norm[seedFileName(tc.name)] = corpusString(tc.raw)
		}
	}
	return map[string]map[string]string{"FuzzSymbols": syms, "FuzzNormalize": norm}
}

// seedFileName makes a portable file name of a test case name.
func seedFileName(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' {
			return r
		}
		return '-'
	}, name)
}

func corpusBytes(b []byte) string  { return fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b) }
func corpusString(s string) string { return fmt.Sprintf("go test fuzz v1\nstring(%q)\n", s) }

// TestFuzzSeeds checks that the committed seed corpus matches the seeds
// the tests generate; -update rewrites it, and also stores the first KiB
// of /bin/true (a real, truncated ELF file) as a FuzzSymbols seed.
func TestFuzzSeeds(t *testing.T) {
	for target, seeds := range committedSeeds() {
		dir := filepath.Join("testdata", "fuzz", target)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for name, want := range seeds {
			path := filepath.Join(dir, name)
			if *update {
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != want {
				t.Errorf("%s is missing or stale (err %v): run go test -run TestFuzzSeeds -update", path, err)
			}
		}
	}
	if *update {
		b, err := os.ReadFile("/bin/true")
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "fuzz", "FuzzSymbols", "bin-true-head")
		if err := os.WriteFile(path, []byte(corpusBytes(b[:min(len(b), 1024)])), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
