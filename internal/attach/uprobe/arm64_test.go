package uprobe

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// Words from GNU as (aarch64-linux-gnu-as, objdump -d), so the decoder is
// checked against the assembler; the decisions are the kernel's rules
// (arch/arm64/kernel/probes/decode-insn.c), written out per instruction.
var arm64Tests = []struct {
	asm     string
	word    uint32
	entry   string
	refused string
}{
	{"nop", 0xd503201f, EntrySimulatedSince, ""},
	{"b.ne .", 0x54000001, EntrySimulated, ""},
	{"cbz x0, .", 0xb4000000, EntrySimulated, ""},
	{"cbnz w1, .", 0x35000001, EntrySimulated, ""},
	{"tbz w2, #3, .", 0x36180002, EntrySimulated, ""},
	{"tbnz w3, #1, .", 0x37080003, EntrySimulated, ""},
	{"b .", 0x14000000, EntrySimulated, ""},
	{"bl .", 0x94000000, EntrySimulated, ""},
	{"br x16", 0xd61f0200, EntrySimulated, ""},
	{"blr x1", 0xd63f0020, EntrySimulated, ""},
	{"ret", 0xd65f03c0, EntrySimulated, ""},
	{"ret x3", 0xd65f0060, EntrySimulated, ""},
	{"adr x0, .", 0x10000000, EntrySimulated, ""},
	{"adrp x1, .", 0x90000001, EntrySimulated, ""},

	// Stepped out of line: the usual function entries among them.
	{"bti c", 0xd503245f, EntryStepped, ""},
	{"bti", 0xd503241f, EntryStepped, ""},
	{"bti j", 0xd503249f, EntryStepped, ""},
	{"bti jc", 0xd50324df, EntryStepped, ""},
	{"paciasp", 0xd503233f, EntryStepped, ""},
	{"pacibsp", 0xd503237f, EntryStepped, ""},
	{"xpaclri", 0xd50320ff, EntryStepped, ""},
	{"stp x29, x30, [sp, #-16]!", 0xa9bf7bfd, EntryStepped, ""},
	{"mov x29, sp", 0x910003fd, EntryStepped, ""},
	{"sub sp, sp, #0x20", 0xd10083ff, EntryStepped, ""},
	{"ldr x0, [x1]", 0xf9400020, EntryStepped, ""},
	{"ldar x0, [x1] (ordered, not exclusive)", 0xc8dffc20, EntryStepped, ""},
	{"cas x0, x1, [x2] (single-copy atomic)", 0xc8a07c41, EntryStepped, ""},
	{"ldadd x0, x1, [x2]", 0xf8200041, EntryStepped, ""},
	{"mrs x0, tpidr_el0", 0xd53bd040, EntryStepped, ""},
	{"isb", 0xd5033fdf, EntryStepped, ""},
	{"dmb ish", 0xd5033bbf, EntryStepped, ""},

	// Refused.
	{"bc.eq . (FEAT_HBC: would be stepped at the wrong PC)", 0x54000010, "", RefusedBranch},
	{"braa x1, x2", 0xd71f0822, "", RefusedBranch},
	{"blraa x1, x2", 0xd73f0822, "", RefusedBranch},
	{"retaa", 0xd65f0bff, "", RefusedBranch},
	{"eret", 0xd69f03e0, "", RefusedSystem},
	{"autiasp", 0xd50323bf, "", RefusedHint},
	{"yield", 0xd503203f, "", RefusedHint},
	{"wfe", 0xd503205f, "", RefusedHint},
	{"ldr x0, . (literal)", 0x58000000, "", RefusedLiteralLoad},
	{"ldr w0, . (literal)", 0x18000000, "", RefusedLiteralLoad},
	{"ldrsw x0, .", 0x98000000, "", RefusedLiteralLoad},
	{"prfm pldl1keep, .", 0xd8000000, "", RefusedLiteralLoad},
	{"ldr q0, . (SIMD&FP literal)", 0x9c000000, "", RefusedLiteralLoad},
	{"ldr d0, . (SIMD&FP literal)", 0x5c000000, "", RefusedLiteralLoad},
	{"ldxr x0, [x1]", 0xc85f7c20, "", RefusedExclusive},
	{"stxr w2, x0, [x1]", 0xc8027c20, "", RefusedExclusive},
	{"ldaxr w0, [x1]", 0x885ffc20, "", RefusedExclusive},
	{"casp x0, x1, x2, x3, [x4]", 0x48207c82, "", RefusedExclusive},
	{"svc #0", 0xd4000001, "", RefusedException},
	{"brk #0", 0xd4200000, "", RefusedException},
	{"mrs x0, daif", 0xd53b4220, "", RefusedSystem},
	{"msr tpidr_el0, x0", 0xd51bd040, "", RefusedSystem},
	{"msr daifset, #2", 0xd50342df, "", RefusedSystem},
	{"cpyp [x0]!, [x1]!, x2!", 0x1d010440, "", RefusedMOPS},
	{"setp [x0]!, x1!, x2", 0x19c20420, "", RefusedMOPS},
}

func TestDecodeARM64(t *testing.T) {
	t.Parallel()
	for _, tc := range arm64Tests {
		entry, refused := decodeARM64(tc.word)
		if entry != tc.entry || refused != tc.refused {
			t.Errorf("%s (%#08x): entry %q, refused %q; want %q, %q", tc.asm, tc.word, entry, refused, tc.entry, tc.refused)
		}
	}
}

// arm64Src: functions whose first instruction is what the compiler makes
// of them (checked with objdump before the decision is), and hand-written
// entries the kernel refuses.
const arm64Src = `
extern int ext(int);
int g;
int leaf(int a) { return a * 3 + 1; }
int tail(int a) { return ext(a); }
int get(void) { return g; }
int nonleaf(int a) { return ext(a) + 1; }
__asm__(".text\n.p2align 2\n.globl excl\n.type excl,%function\nexcl:\n\tldxr w9, [sp]\n\tclrex\n\tret\n.size excl, .-excl\n"
	".globl lit\n.type lit,%function\nlit:\n\tldr w0, 1f\n\tret\n1:\t.word 7\n.size lit, .-lit\n"
	".globl svc\n.type svc,%function\nsvc:\n\tsvc #0\n\tret\n.size svc, .-svc\n"
	".p2align 2\n.byte 0, 0\n.globl odd\n.type odd,%function\nodd:\n\t.byte 0x1f, 0x20, 0x03, 0xd5\n.size odd, .-odd\n");
`

// Real arm64 machine code, built with and without BTI and PAC
// (-mbranch-protection=standard, as NVIDIA builds its arm64 libraries):
// each function's first instruction as objdump names it, and the
// placement that instruction gets. The probe is always at the symbol.
func TestDefinedFuncsARM64(t *testing.T) {
	t.Parallel()
	cc, err := testutil.CC("arm64")
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("%v, and %s=1 forbids skipping", err, testenv.E2EEnv)
		}
		t.Skip(err)
	}
	type want struct {
		first, entry, refused string
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  map[string]want
	}{
		{"standard", []string{"-mbranch-protection=standard"}, map[string]want{
			"leaf":    {"bti", EntryStepped, ""},
			"tail":    {"bti", EntryStepped, ""},
			"get":     {"bti", EntryStepped, ""},
			"nonleaf": {"paciasp", EntryStepped, ""},
		}},
		{"none", []string{"-mbranch-protection=none"}, map[string]want{
			"tail":    {"b", EntrySimulated, ""},
			"get":     {"adrp", EntrySimulated, ""},
			"nonleaf": {"stp", EntryStepped, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := filepath.Join(dir, "f.c")
			if err := os.WriteFile(src, []byte(arm64Src), 0o644); err != nil {
				t.Fatal(err)
			}
			so := filepath.Join(dir, "libf.so")
			args := append([]string{"-O2", "-fPIC", "-shared", "-fno-inline", "-o", so, src}, tc.flags...)
			if out, err := cc.Command(args...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cc.Path, err, out)
			}
			for name, w := range map[string]want{"excl": {"ldxr", "", RefusedExclusive}, "lit": {"ldr", "", RefusedLiteralLoad},
				"svc": {"svc", "", RefusedException}, "odd": {"", "", RefusedUnaligned}} {
				tc.want[name] = w
			}
			f, err := os.Open(so)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var names []string
			for n := range tc.want {
				names = append(names, n)
			}
			if _, err := DefinedFuncs(f, names, false, elf.EM_X86_64); err == nil || !strings.Contains(err.Error(), "EM_AARCH64") {
				t.Errorf("an arm64 file read for an x86-64 kernel: err %v, want the machines named", err)
			}
			funcs, err := DefinedFuncs(f, names, false, elf.EM_AARCH64)
			if err != nil {
				t.Fatal(err)
			}
			for name, w := range tc.want {
				fn, ok := funcs[name]
				if !ok {
					t.Errorf("%s not found", name)
					continue
				}
				if w.first != "" {
					if got := firstMnemonic(t, cc, so, name); got != w.first {
						t.Fatalf("%s starts with %q, want %q: the compiler's code differs from this test's premise", name, got, w.first)
					}
				}
				var refused string
				if fn.Refused != nil {
					refused = fn.Refused.Reason
				}
				if fn.Offset != 0 || fn.Placement != "" || fn.Entry != w.entry || refused != w.refused {
					t.Errorf("%s: offset %d %q, entry %q, refused %q; want 0, entry %q, refused %q", name, fn.Offset, fn.Placement, fn.Entry, refused, w.entry, w.refused)
				}
			}
		})
	}
}

// firstMnemonic is the first instruction's mnemonic of function name in
// so, as the target's objdump names it.
func firstMnemonic(t *testing.T, cc testutil.Compiler, so, name string) string {
	t.Helper()
	objdump := strings.TrimSuffix(cc.Path, "gcc") + "objdump"
	out, err := exec.Command(objdump, "-d", "--disassemble="+name, so).Output()
	if err != nil {
		t.Fatalf("%s: %v", objdump, err)
	}
	for line := range bytes.Lines(out) {
		// "  5f0:\td503245f \tbti\tc"
		fields := strings.Split(strings.TrimSpace(string(line)), "\t")
		if len(fields) >= 3 && strings.HasSuffix(fields[0], ":") {
			return strings.Fields(fields[2])[0]
		}
	}
	t.Fatalf("%s: no instruction of %s in:\n%s", objdump, name, out)
	return fmt.Sprint()
}
