package kernelname

import (
	"bytes"
	"os"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzNormalize checks the properties the `kernel` label relies on for any
// input: no panic, valid UTF-8 without control characters, at most
// MaxNameLen bytes, and idempotence (a normalized name normalizes to
// itself, so names can be normalized again anywhere without new series).
func FuzzNormalize(f *testing.F) {
	for _, tc := range normalizeCases {
		f.Add(tc.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := Normalize(raw)
		if !utf8.ValidString(got) {
			t.Fatalf("Normalize(%q) = %q: not valid UTF-8", raw, got)
		}
		if len(got) > MaxNameLen {
			t.Fatalf("Normalize(%q) = %q: %d bytes", raw, got, len(got))
		}
		for _, r := range got {
			if unicode.IsControl(r) {
				t.Fatalf("Normalize(%q) = %q: control character %U", raw, got, r)
			}
		}
		if again := Normalize(got); again != got {
			t.Fatalf("Normalize(%q) = %q, but Normalize(%q) = %q", raw, got, got, again)
		}
	})
}

// FuzzSymbols feeds arbitrary bytes to the ELF symbol-table reader and
// looks up addresses in what it returns: errors are fine, panics and hangs
// are not.
func FuzzSymbols(f *testing.F) {
	tiny := tinyELF(tinyOpts{})
	f.Add(tiny)
	f.Add(tinyELF(tinyOpts{dynsym: true}))
	for _, data := range corruptSeeds(tiny) {
		f.Add(data)
	}
	if b, err := os.ReadFile("/bin/true"); err == nil {
		f.Add(b[:min(len(b), 4096)])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := readSymtab(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		for _, off := range []uint64{0, tinyTextOff, tinyTextOff + 8, 0x1000, ^uint64(0)} {
			if v, ok := tab.vaddr(off); ok {
				tab.lookup(v)
			}
		}
		for _, s := range tab.syms {
			tab.lookup(s.value)
			tab.lookup(s.value + s.size/2)
		}
	})
}
