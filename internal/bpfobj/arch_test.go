package bpfobj

import (
	"bytes"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// The objects bpf2go generates, one per architecture (gen.go), and the
// register frame a uprobe program reads on each: offsets of the kernel's
// uapi frames (x86-64 struct pt_regs, arm64 struct user_pt_regs), not read
// from the object. reads lists, per program, the registers its argument
// layouts need by each calling convention (the ops table's layouts,
// bpf/arch/): which arguments are in registers and which on the stack
// (sp), the return address (x30 on arm64, on the stack on x86-64), the
// return value, the probe address (hit_flags).
var archObjects = []struct {
	goarch, file string
	frame        map[uint64]string // offset -> register
	reads        map[string]string // program -> the registers it reads
}{
	{"amd64", "profi_x86_bpfel.o", map[uint64]string{
		112: "rdi", 104: "rsi", 96: "rdx", 88: "rcx", 72: "r8", 64: "r9",
		80: "rax", 152: "rsp", 128: "rip",
	}, map[string]string{
		// Launches: dim3s in two registers each, shared memory and stream
		// (runtime) or block z, shared memory, stream (driver) on the
		// stack above the return address.
		"timed_entry":  "rdi rsi rdx rcx r8 r9 rsp rip",
		"launch_entry": "rdi rsi rdx rcx r8 r9 rsp rip",
		// ncclReduce's comm is the seventh argument, on the stack; so is
		// ncclCommInitRank's 128-byte id, by value.
		"nccl_entry":   "rdi rsi rdx rcx r8 r9 rsp rip",
		"name_entry":   "rsi rdx rip",
		"nvtx_push":    "rdi rsi rip",
		"nvtx_pop":     "rip",
		"timed_return": "rax rip",
		"nccl_return":  "rax rip",
		"dl_event":     "",
	}},
	{"arm64", "profi_arm64_bpfel.o", map[uint64]string{
		0: "x0", 8: "x1", 16: "x2", 24: "x3", 32: "x4", 40: "x5", 48: "x6", 56: "x7",
		232: "x29", 240: "x30", 248: "sp", 256: "pc",
	}, map[string]string{
		// cudaLaunchKernel's shared memory and stream in x6 and x7,
		// cuLaunchKernel's stream at sp; the return address in x30; the
		// frame-record chain from x29 (call_live: is the runtime launch
		// that left a marker still running).
		"timed_entry":  "x0 x1 x2 x3 x4 x5 x6 x7 x30 sp pc",
		"launch_entry": "x0 x1 x2 x3 x4 x5 x6 x7 x29 x30 sp pc",
		// ncclReduce's comm in x6; ncclCommInitRank's id by reference in
		// x2, rank in x3: nothing on the stack.
		"nccl_entry":   "x0 x1 x2 x3 x4 x5 x6 pc",
		"name_entry":   "x1 x2 pc",
		"nvtx_push":    "x0 x1 pc",
		"nvtx_pop":     "pc",
		"timed_return": "x0 pc",
		"nccl_return":  "x0 pc",
		"dl_event":     "",
	}},
}

func loadArchSpecs(t *testing.T) []*ebpf.CollectionSpec {
	t.Helper()
	specs := make([]*ebpf.CollectionSpec, len(archObjects))
	for i, o := range archObjects {
		spec, err := ebpf.LoadCollectionSpec(o.file)
		if err != nil {
			t.Fatalf("%s object (make generate): %v", o.goarch, err)
		}
		specs[i] = spec
	}
	return specs
}

// TestArchObjectsAgree: both architectures' objects were generated from
// the same source: the same programs (names, types, sections), the same
// maps (types, sizes, flags, read-only contents such as the operation
// tables), and Go bindings that differ only in their build tag and
// embedded file. A source edit regenerated for one architecture only
// fails here.
func TestArchObjectsAgree(t *testing.T) {
	t.Parallel()
	specs := loadArchSpecs(t)
	x86, arm := specs[0], specs[1]
	if a, b := slices.Sorted(maps.Keys(x86.Programs)), slices.Sorted(maps.Keys(arm.Programs)); !slices.Equal(a, b) {
		t.Fatalf("programs differ: amd64 %v, arm64 %v", a, b)
	}
	for name, p := range x86.Programs {
		q := arm.Programs[name]
		if p.Type != q.Type || p.SectionName != q.SectionName || p.License != q.License {
			t.Errorf("program %s: amd64 %v %q %q, arm64 %v %q %q", name, p.Type, p.SectionName, p.License, q.Type, q.SectionName, q.License)
		}
	}
	if a, b := slices.Sorted(maps.Keys(x86.Maps)), slices.Sorted(maps.Keys(arm.Maps)); !slices.Equal(a, b) {
		t.Fatalf("maps differ: amd64 %v, arm64 %v", a, b)
	}
	for name, m := range x86.Maps {
		n := arm.Maps[name]
		if m.Type != n.Type || m.KeySize != n.KeySize || m.ValueSize != n.ValueSize || m.MaxEntries != n.MaxEntries || m.Flags != n.Flags {
			t.Errorf("map %s: amd64 %v %d/%d/%d/%#x, arm64 %v %d/%d/%d/%#x", name,
				m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, n.Type, n.KeySize, n.ValueSize, n.MaxEntries, n.Flags)
		}
		if !reflect.DeepEqual(m.Contents, n.Contents) {
			t.Errorf("map %s: contents differ between amd64 and arm64", name)
		}
	}
	// The Go bindings: the same types and names.
	strip := func(file string) []byte {
		var out []string
		for l := range strings.Lines(string(mustRead(t, file))) {
			if !strings.HasPrefix(l, "//go:build ") && !strings.HasPrefix(l, "//go:embed ") {
				out = append(out, l)
			}
		}
		return []byte(strings.Join(out, ""))
	}
	if !bytes.Equal(strip("profi_x86_bpfel.go"), strip("profi_arm64_bpfel.go")) {
		t.Error("profi_x86_bpfel.go and profi_arm64_bpfel.go differ beyond their build tag and embedded file: run make generate")
	}
}

// TestArchRegisterReads: in each architecture's object, every uprobe
// program reads its context (the register frame) only at constant offsets
// of that architecture's frame, never through a computed address, and
// reads exactly the registers its calling convention puts its arguments
// in. An x86 register read compiled for arm64 (ctx->rdi is offset 112, x14
// there) fails, as does an arm64 object that takes cudaLaunchKernel's
// shared memory from the stack, or ncclCommInitRank's id.
func TestArchRegisterReads(t *testing.T) {
	t.Parallel()
	specs := loadArchSpecs(t)
	for i, o := range archObjects {
		for name, p := range specs[i].Programs {
			if p.Type != ebpf.Kprobe { // a tracepoint's context is no register frame
				continue
			}
			seen := map[string]bool{}
			for _, r := range ctxReads(p.Instructions) {
				if r.modified {
					t.Errorf("%s %s: instruction %d computes on the context pointer (the verifier refuses reads through it)", o.goarch, name, r.at)
					continue
				}
				reg, ok := o.frame[uint64(r.off)]
				if !ok || r.size != asm.DWord {
					t.Errorf("%s %s: context read %v at offset %d (instruction %d): not a register of the %s frame",
						o.goarch, name, r.size, r.off, r.at, o.goarch)
					continue
				}
				seen[reg] = true
			}
			want, ok := o.reads[name]
			if !ok {
				t.Errorf("%s %s: no expected register reads in archObjects: add the registers its argument layouts need", o.goarch, name)
				continue
			}
			if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, slices.Sorted(slices.Values(strings.Fields(want)))) {
				t.Errorf("%s %s reads %v, want %s", o.goarch, name, got, want)
			}
		}
	}
}

type ctxRead struct {
	at   int
	off  int16
	size asm.Size
	// modified: an instruction that computes on the context pointer (the
	// verifier refuses a read through it: "modified ctx ptr"); off is 0.
	modified bool
}

// ctxReads finds the loads through the program's context pointer, and
// arithmetic on it: R1 at the entry, followed through register moves and
// stack spills along every path of the control flow graph, as the
// verifier follows it (a register or slot that holds the context on any
// path counts). Subprograms get no context.
func ctxReads(insns asm.Instructions) []ctxRead {
	type state struct {
		regs  uint16
		slots map[int16]bool // R10-relative 8-byte stack slots
	}
	clone := func(s state) state {
		c := state{regs: s.regs, slots: make(map[int16]bool, len(s.slots))}
		maps.Copy(c.slots, s.slots)
		return c
	}
	// Raw instruction positions (a 64-bit immediate load takes two), for jumps.
	pos := make([]int, len(insns)+1)
	at := map[int]int{}
	for i, ins := range insns {
		at[pos[i]] = i
		pos[i+1] = pos[i] + int(ins.Size()/asm.InstructionSize)
	}
	at[pos[len(insns)]] = len(insns)
	in := make([]*state, len(insns))
	var work []int
	merge := func(i int, s state) {
		if i >= len(insns) {
			return
		}
		if in[i] == nil {
			c := clone(s)
			in[i] = &c
			work = append(work, i)
			return
		}
		changed := s.regs&^in[i].regs != 0
		in[i].regs |= s.regs
		for k, v := range s.slots {
			if v && !in[i].slots[k] {
				in[i].slots[k], changed = true, true
			}
		}
		if changed {
			work = append(work, i)
		}
	}
	merge(0, state{regs: 1 << asm.R1, slots: map[int16]bool{}})
	for i, ins := range insns {
		if i > 0 && ins.Symbol() != "" { // a subprogram: no context
			merge(i, state{slots: map[int16]bool{}})
		}
	}
	found := map[ctxRead]bool{}
	has := func(s *state, r asm.Register) bool { return s.regs&(1<<r) != 0 }
	set := func(s *state, r asm.Register, v bool) {
		if v {
			s.regs |= 1 << r
		} else {
			s.regs &^= 1 << r
		}
	}
	for len(work) > 0 {
		i := work[len(work)-1]
		work = work[:len(work)-1]
		s := clone(*in[i])
		ins := insns[i]
		op := ins.OpCode
		next := []int{i + 1}
		switch cls := op.Class(); {
		case ins.IsFunctionCall() || ins.IsBuiltinCall() || ins.IsKfuncCall():
			for r := asm.R0; r <= asm.R5; r++ {
				set(&s, r, false)
			}
		case cls.IsJump():
			switch op.JumpOp() {
			case asm.Exit:
				next = nil
			case asm.Ja:
				next = []int{at[pos[i+1]+int(ins.Offset)]}
			default:
				next = append(next, at[pos[i+1]+int(ins.Offset)])
			}
		case cls == asm.LdXClass && op.Mode() == asm.MemMode:
			if has(&s, ins.Src) {
				found[ctxRead{at: i, off: ins.Offset, size: op.Size()}] = true
			}
			set(&s, ins.Dst, ins.Src == asm.R10 && s.slots[ins.Offset] && op.Size() == asm.DWord)
		case cls == asm.StXClass && op.Mode() == asm.MemMode && ins.Dst == asm.R10:
			s.slots[ins.Offset] = has(&s, ins.Src) && op.Size() == asm.DWord
		case cls == asm.StClass && ins.Dst == asm.R10:
			s.slots[ins.Offset] = false
		case cls.IsALU():
			// A move only writes its destination; every other operation computes on it.
			mov := op.ALUOp() == asm.Mov
			if !mov && has(&s, ins.Dst) {
				found[ctxRead{at: i, modified: true}] = true
			}
			set(&s, ins.Dst, mov && cls == asm.ALU64Class && op.Source() == asm.RegSource && has(&s, ins.Src))
		case cls == asm.LdClass:
			set(&s, ins.Dst, false)
		}
		for _, n := range next {
			merge(n, s)
		}
	}
	out := slices.Collect(maps.Keys(found))
	slices.SortFunc(out, func(a, b ctxRead) int { return a.at - b.at })
	return out
}
