package uprobe

import (
	"debug/elf"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// Encodings from GNU as (objdump -d), so the decoder is checked against
// the assembler, not against itself.
var insnTests = []struct {
	asm     string
	hex     string
	refused string // refusedPrefix
	movable int    // movableLen; 0: not movable
}{
	{"lock incl g(%rip)", "f0ff0500000000", RefusedLockPrefix, 7},
	{"lock addl $1,g(%rip)", "f0830500000000" + "01", RefusedLockPrefix, 8},
	{"lock addq $0x12345,g(%rip)", "f048810500000000" + "45230100", RefusedLockPrefix, 12},
	{"lock orq $0,(%rsp)", "f048830c2400", RefusedLockPrefix, 6},
	{"lock addl $0,-4(%rsp)", "f0834424fc00", RefusedLockPrefix, 6},
	{"lock orl $0,8(%rdi)", "f0834f0800", RefusedLockPrefix, 5},
	{"lock addl $0,0x1000(%rsp)", "f08384240010000000", RefusedLockPrefix, 9},
	{"lock subb $0,(%rax,%rbx,4)", "f0802c9800", RefusedLockPrefix, 5},
	{"lock orq $0,(%r12)", "f049830c2400", RefusedLockPrefix, 6},
	{"lock orq $0,0x10(,%rax,8)", "f048830cc51000000000", RefusedLockPrefix, 10},
	{"lock btsl $3,g(%rip)", "f00fba2d00000000" + "03", RefusedLockPrefix, 9},
	{"lock addw $0x1234,g(%rip)", "66f0810500000000" + "3412", RefusedLockPrefix, 10},
	{"lock negl g(%rip)", "f0f71d00000000", RefusedLockPrefix, 7},
	{"lock decq g(%rip)", "f048ff0d00000000", RefusedLockPrefix, 8},
	{"lock and %edi,g(%rip)", "f0213d00000000", RefusedLockPrefix, 7},
	{"cs nopw (%rax,%rax,1)", "2e660f1f0400", RefusedSegmentPrefix, 6},
	{"ds nop", "3e90", RefusedSegmentPrefix, 2},

	// Not movable: a register written, or memory changed that may be an
	// argument or the return address, or an encoding left unrecognised.
	{"lock addl $1,(%rsp)", "f083042401", RefusedLockPrefix, 0},
	{"lock incl (%rdi)", "f0ff07", RefusedLockPrefix, 0},
	{"lock xadd %ecx,g(%rip)", "f00fc10d00000000", RefusedLockPrefix, 0},
	{"lock cmpxchg %rsi,g(%rip)", "f0480fb13500000000", RefusedLockPrefix, 0},
	{"lock xchg %eax,g(%rip)", "f0870500000000", RefusedLockPrefix, 0},
	{"lock bts %rax,g(%rip)", "f0480fab0500000000", RefusedLockPrefix, 0},
	{"lock notq 0x10(%r12)", "f049f7542410", RefusedLockPrefix, 0},
	{"lock adcl $0,(%rsp) (adds the carry)", "f083142400", RefusedLockPrefix, 0},
	{"xacquire lock incl g(%rip)", "f2f0ff0500000000", RefusedLockPrefix, 0},
	{"lock cmpxchg8b g(%rip)", "f00fc70d00000000", RefusedLockPrefix, 0},
	{"es mov (%rax),%eax", "268b00", RefusedSegmentPrefix, 0},
	{"ss push %rbp", "3655", RefusedSegmentPrefix, 0},
	{"notrack jmp *%rax", "3effe0", RefusedSegmentPrefix, 0},

	// Accepted by the kernel.
	{"push %rbp", "55", "", 0},
	{"endbr64", "f30f1efa", "", 0},
	{"mov %fs:0x28,%rax", "64488b042528000000", "", 0},
	{"data16 cs nopw (not a cs first: 66 then 2e)", "662e0f1f840000000000", RefusedSegmentPrefix, 10},
	{"rep stos", "f3ab", "", 0},
	{"nothing", "", "", 0},
}

func TestPrologueOffset(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		code []byte
		want uint64
	}{
		{"endbr64; push %rbp", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48}, 4},
		{"endbr64; push %rbx", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x53, 0x48}, 4},
		{"endbr64; push %r12", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x54}, 4},
		{"endbr64; push %r15", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57}, 4},
		{"endbr64; mov (single-stepped anyway)", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x89}, 0},
		{"endbr64; rex.B but not a push", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x89}, 0},
		{"endbr64 at the end of the bytes", []byte{0xf3, 0x0f, 0x1e, 0xfa}, 0},
		{"push %rbp first (already one trap)", []byte{0x55, 0x48, 0x89, 0xe5, 0, 0}, 0},
		{"endbr32 is not endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfb, 0x55, 0}, 0},
		{"nothing", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := prologueOffset(tc.code); got != tc.want {
				t.Errorf("prologueOffset(% x) = %d, want %d", tc.code, got, tc.want)
			}
		})
	}
}

func TestRefusedPrefixAndMovable(t *testing.T) {
	t.Parallel()
	for _, tc := range insnTests {
		code, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		if got := refusedPrefix(code); got != tc.refused {
			t.Errorf("%s: refusedPrefix(% x) = %q, want %q", tc.asm, code, got, tc.refused)
		}
		// Followed by other code, as in a function.
		n, ok := movableLen(append(code, 0x55, 0x48, 0x89, 0xe5))
		if tc.movable == 0 && ok {
			t.Errorf("%s: movableLen = %d, want not movable", tc.asm, n)
		}
		if tc.movable != 0 && (!ok || n != tc.movable) {
			t.Errorf("%s: movableLen = %d, %v, want %d", tc.asm, n, ok, tc.movable)
		}
		if tc.movable != 0 && n != len(code) {
			t.Errorf("%s: test vector has %d bytes, want the instruction's %d", tc.asm, len(code), n)
		}
	}
}

// An instruction cut short by the end of the bytes is not movable.
func TestMovableTruncated(t *testing.T) {
	t.Parallel()
	for _, code := range [][]byte{{0xf0}, {0xf0, 0xff}, {0xf0, 0xff, 0x05}, {0xf0, 0xff, 0x05, 0, 0, 0}, {0xf0, 0x83, 0x0c, 0x24}} {
		if n, ok := movableLen(code); ok {
			t.Errorf("movableLen(% x) = %d, want not movable", code, n)
		}
	}
}

func TestBranchesTo(t *testing.T) {
	t.Parallel()
	lockInc := "f0ff0500000000" // 7 bytes: the probe would move to 7
	tests := []struct {
		name string
		code string
		want bool
	}{
		{"straight", lockInc + "55" + "4889e5" + "c3", false},
		{"jmp rel8 forward", lockInc + "eb02" + "9090" + "c3", false},
		{"jmp rel8 to the start (spin)", lockInc + "ebf7", true},
		{"jcc rel8 to the moved probe", lockInc + "55" + "75fd", true},  // at 8: 8+2-3 = 7
		{"jcc rel32 to the start", lockInc + "0f85" + "f3ffffff", true}, // at 7: 7+6-13 = 0
		{"jmp rel32 far forward", lockInc + "e9" + "00100000", false},
		{"call rel32 to the moved probe", lockInc + "e8" + "fbffffff", true}, // 7+5-5 = 7
		{"loop rel8 back", lockInc + "e2f7", true},
		{"call to the symbol (recursion, a new call)", lockInc + "e8" + "f4ffffff", true}, // conservative
		{"jcc truncated", lockInc + "0f85f3", false},
	}
	for _, tc := range tests {
		code, err := hex.DecodeString(tc.code)
		if err != nil {
			t.Fatal(err)
		}
		if got := branchesTo(code, 7); got != tc.want {
			t.Errorf("%s: branchesTo(% x, 7) = %v, want %v", tc.name, code, got, tc.want)
		}
	}
}

// The locked stubs: cudaGraphLaunch starts with "lock xadd %ecx" (a
// register written: refused, not offered, reported with its bytes) or
// "lock incl" on a global (moved to the next instruction, +7); every
// other function keeps its probe at the symbol.
func TestDefinedFuncsRefused(t *testing.T) {
	t.Parallel()
	fx := fixtures(t)
	for _, tc := range []struct {
		path      string
		offset    uint64
		placement string
		refused   string
		code      string
	}{
		{fx.CudartLocked, 0, "", RefusedLockPrefix, "f00fc10d"},
		{fx.CudartLockedMovable, 7, PlacementPastRefused, "", ""},
	} {
		f, err := os.Open(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := DefinedFuncs(f, probedNames("libcudart.so"), false, elf.EM_X86_64)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for name, s := range syms {
			if name != "cudaGraphLaunch" {
				if s.Offset != 0 || s.Placement != "" || s.Refused != nil {
					t.Errorf("%s: %s placed at +%d (%q), refused %+v; want +0", tc.path, name, s.Offset, s.Placement, s.Refused)
				}
				continue
			}
			if s.Offset != tc.offset || s.Placement != tc.placement {
				t.Errorf("%s: cudaGraphLaunch at +%d (%q), want +%d (%q)", tc.path, s.Offset, s.Placement, tc.offset, tc.placement)
			}
			switch {
			case tc.refused == "" && s.Refused != nil:
				t.Errorf("%s: cudaGraphLaunch refused %+v", tc.path, s.Refused)
			case tc.refused != "" && (s.Refused == nil || s.Refused.Reason != tc.refused || !strings.HasPrefix(hex.EncodeToString(s.Refused.Code), tc.code)):
				t.Errorf("%s: cudaGraphLaunch refused %+v, want %s with code %s…", tc.path, s.Refused, tc.refused, tc.code)
			}
		}
		if _, ok := syms["cudaGraphLaunch"]; !ok {
			t.Errorf("%s does not define cudaGraphLaunch", tc.path)
		}
	}
}

// The decoder reads tenant-controlled bytes: no panic, and a movable
// length never past the bytes or the longest instruction.
func FuzzInsn(f *testing.F) {
	for _, tc := range insnTests {
		code, _ := hex.DecodeString(tc.hex)
		f.Add(code, 7)
	}
	f.Fuzz(func(t *testing.T, code []byte, to int) {
		_ = refusedPrefix(code)
		if n, ok := movableLen(code); ok && (n <= 0 || n > len(code) || n > maxInsn) {
			t.Fatalf("movableLen(% x) = %d", code, n)
		}
		_ = branchesTo(code, to)
	})
}
