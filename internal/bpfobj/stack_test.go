package bpfobj

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// maxStack is what every verifier profi supports allows a program's
// deepest call chain: 512 bytes, each function's frame rounded up to 32
// (docs/KERNELS.md: 6.1 counts it so, with no private stacks).
const maxStack = 512

// frameSizes returns each function of a program's instructions (the
// program first, then the subprograms it calls) with the bytes of stack
// it touches below r10: directly (loads and stores off r10) or through a
// pointer made from it (rX = r10; rX += -N), and the functions it calls.
func frameSizes(insns asm.Instructions) (sizes map[string]int, calls map[string][]string, first string) {
	sizes, calls = map[string]int{}, map[string][]string{}
	var fn string
	fp := map[asm.Register]int16{} // registers holding r10+offset
	for _, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			fn = sym
			if first == "" {
				first = sym
			}
			sizes[fn] = 0
			clear(fp)
		}
		touch := func(off int16) {
			if -int(off) > sizes[fn] {
				sizes[fn] = -int(off)
			}
		}
		op := ins.OpCode
		switch {
		case ins.IsFunctionCall():
			calls[fn] = append(calls[fn], ins.Reference())
		case op.Class().IsLoad() && ins.Src == asm.R10, op.Class().IsStore() && ins.Dst == asm.R10:
			touch(ins.Offset)
		case op == asm.Mov.Op(asm.RegSource) && ins.Src == asm.R10:
			fp[ins.Dst] = 0
		case op == asm.Add.Op(asm.ImmSource) && hasKey(fp, ins.Dst):
			fp[ins.Dst] += int16(ins.Constant)
			touch(fp[ins.Dst])
		default:
			if op.Class().IsALU() || op.Class().IsLoad() {
				delete(fp, ins.Dst)
			}
		}
	}
	return sizes, calls, first
}

func hasKey(m map[asm.Register]int16, r asm.Register) bool { _, ok := m[r]; return ok }

// TestStackDepth: no program's deepest chain of bpf-to-bpf calls needs
// more than 512 bytes of stack as 6.1's verifier counts it (each frame
// rounded up to 32). Newer verifiers accept what 6.1 refuses here, so the
// host's load tests alone would not catch it; the kernel matrix would, in
// minutes.
func TestStackDepth(t *testing.T) {
	t.Parallel()
	specs := loadArchSpecs(t)
	for i, o := range archObjects {
		for name, p := range specs[i].Programs {
			sizes, calls, first := frameSizes(p.Instructions)
			var deepest func(fn string, seen map[string]bool) (int, string)
			deepest = func(fn string, seen map[string]bool) (int, string) {
				if seen[fn] {
					t.Fatalf("%s %s: recursion through %s", o.goarch, name, fn)
				}
				seen[fn] = true
				defer delete(seen, fn)
				own := (max(sizes[fn], 1) + 31) / 32 * 32
				best, path := 0, ""
				for _, c := range calls[fn] {
					if d, p := deepest(c, seen); d > best {
						best, path = d, p
					}
				}
				return own + best, fmt.Sprintf("%s(%d) %s", fn, own, path)
			}
			d, path := deepest(first, map[string]bool{})
			t.Logf("%s %s: %d bytes: %s", o.goarch, name, d, path)
			if d > maxStack {
				t.Errorf("%s %s: the deepest call chain needs %d bytes of stack, over %d: %s", o.goarch, name, d, maxStack, path)
			}
		}
	}
}
