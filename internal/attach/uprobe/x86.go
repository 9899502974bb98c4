package uprobe

import (
	"slices"

	"github.com/profi-dev/profi/internal/elfsym"
	"github.com/profi-dev/profi/internal/status"
)

// The x86-64 kernel refuses a uprobe on some instructions (EOPNOTSUPP,
// errno 524 ENOTSUPP in fact, at attach time, per address): those with a
// lock prefix or an ES, CS, DS or SS segment prefix
// (arch/x86/kernel/uprobes.c, is_prefix_bad), besides a few opcodes it
// cannot single-step. With uprobe_multi one refused address fails the
// link of every function of the file. What the file's bytes tell is
// decided here, before any attach: a refused first instruction is never
// offered to the kernel, and the probe moves past it when that is
// provably harmless. The kernel's other refusals are found by trying
// (link.go, findRefused).

// Reasons the x86-64 kernel refuses a probed function (/status refused_probes).
const (
	RefusedLockPrefix    = status.RefusedLockPrefix
	RefusedSegmentPrefix = status.RefusedSegmentPrefix
)

// Why probe past the first instruction: the kernel emulates some
// instructions under a uprobe (push, jumps, calls) and single-steps the
// rest out of line, which costs a second trap. endbr64, the first
// instruction of every function built with -fcf-protection, is
// single-stepped. When it is followed by a push the kernel emulates, the
// probe goes on the push: one trap instead of two, with the same
// registers and stack as at the symbol (docs/PROBES.md, "Probe placement").

var endbr64 = [4]byte{0xf3, 0x0f, 0x1e, 0xfa}

// prologueOffset decides, from the first bytes of a function, where to put
// its probes: 4 (past endbr64) when the next instruction is a push of a
// general register, else 0.
func prologueOffset(code []byte) uint64 {
	if len(code) < 5 || [4]byte(code[:4]) != endbr64 {
		return 0
	}
	next := code[4:]
	switch {
	case next[0] >= 0x50 && next[0] <= 0x57: // push %rax..%rdi
		return 4
	case len(next) >= 2 && next[0] == 0x41 && next[1] >= 0x50 && next[1] <= 0x57: // push %r8..%r15
		return 4
	}
	return 0
}

// placeX86 decides where to probe the x86-64 function s (at file offset
// addr): past an endbr64 followed by a push (prologueOffset); past a
// first instruction the kernel refuses when that instruction changes no
// register the probes read and no stack slot (movableLen), the next one
// is accepted, and no branch of the function leads back to them; else at
// the symbol, marked refused when the kernel would refuse it.
func placeX86(ef *elfsym.File, s elfsym.Symbol, addr uint64) Func {
	code := firstCode(ef, s.Value)
	fs := Func{Addr: addr}
	if off := prologueOffset(code); off != 0 {
		fs.Offset, fs.Placement = off, PlacementPastEndbr64
		return fs
	}
	why := refusedPrefix(code)
	if why == "" {
		return fs
	}
	if n, ok := movableLen(code); ok && len(code) >= n+maxInsn && refusedPrefix(code[n:]) == "" &&
		uint64(n) < s.Size && s.Size <= maxScan && !loopsBack(ef, s, n) {
		fs.Offset, fs.Placement = uint64(n), PlacementPastRefused
		return fs
	}
	fs.Refused = &Refusal{Reason: why, Code: slices.Clone(code[:min(len(code), codeShown)])}
	return fs
}

// loopsBack reads the function s (at most maxScan bytes, asked for by
// placeX86) and reports whether a branch in it may lead to an offset in
// [0, to], or its bytes cannot be read: unsure.
func loopsBack(ef *elfsym.File, s elfsym.Symbol, to int) bool {
	b := body(ef, s)
	return b == nil || branchesTo(b, to)
}

// firstCode reads the first bytes of the function at vaddr: enough for
// two instructions, fewer near the end of its segment (nil: none).
func firstCode(ef *elfsym.File, vaddr uint64) []byte {
	for _, n := range []int{2 * 16, 16, 6} {
		if code, err := ef.Code(vaddr, n); err == nil {
			return code
		}
	}
	return nil
}

// maxInsn is the longest x86 instruction.
const maxInsn = 15

// refusedPrefix says why the kernel refuses a uprobe on the instruction
// at code[0] from its legacy prefixes, or "" when they do not make it
// refuse. Like the kernel's decoder it reads every legacy prefix before
// the opcode (REX only last).
func refusedPrefix(code []byte) string {
	for i, b := range code {
		if i == maxInsn {
			break
		}
		switch b {
		case 0xf0:
			return RefusedLockPrefix
		case 0x26, 0x2e, 0x36, 0x3e:
			return RefusedSegmentPrefix
		case 0x64, 0x65, 0x66, 0x67, 0xf2, 0xf3:
			continue // FS, GS, operand and address size, rep: accepted
		}
		return ""
	}
	return ""
}

// movableLen returns the length of the instruction at code[0] when a
// probe may be placed on the instruction after it instead: the
// instruction writes no register but the flags, and memory only where no
// argument or return address lives. Conservative: anything it does not
// recognise is not movable. Recognised: a nop (segment prefixes allowed,
// as in padding), and a lock-prefixed read-modify-write of memory whose
// only destination is that memory (add, or, adc, sbb, and, sub, xor with
// a register or immediate source; inc, dec, not, neg; bts, btr, btc with
// an immediate), on a global (RIP-relative), or on any memory when it
// cannot change the value (add, or, sub, xor of 0: the `lock orq $0,
// (%rsp)` fence).
func movableLen(code []byte) (int, bool) {
	if len(code) > maxInsn {
		code = code[:maxInsn]
	}
	i := 0
	var lock, opsize bool
prefixes:
	for ; i < len(code); i++ {
		switch code[i] {
		case 0xf0:
			if lock {
				return 0, false
			}
			lock = true
		case 0x66:
			opsize = true
		case 0x26, 0x2e, 0x36, 0x3e:
			// segment: only for nops, checked below
		default:
			break prefixes
		}
	}
	rex := byte(0)
	if i < len(code) && code[i]&0xf0 == 0x40 {
		rex = code[i]
		i++
	}
	if i >= len(code) {
		return 0, false
	}
	op := code[i]
	i++
	if !lock {
		switch {
		case op == 0x90 && rex&0x01 == 0: // nop (not xchg %r8,%rax)
			return i, true
		case op == 0x0f && i < len(code) && code[i] == 0x1f: // nop Ev
			m, ok := modrm(code[i+1:])
			if !ok || m.reg != 0 {
				return 0, false
			}
			return i + 1 + m.len, true
		}
		return 0, false
	}
	if hasSegment(code[:i]) {
		return 0, false
	}
	var (
		immLen  int
		allowed bool
		twoByte bool
	)
	if op == 0x0f {
		if i >= len(code) {
			return 0, false
		}
		op = code[i]
		i++
		twoByte = true
	}
	m, ok := modrm(code[i:])
	if !ok || m.register {
		return 0, false // lock needs a memory operand
	}
	identity := false // the write cannot change the memory's value
	switch {
	case twoByte && op == 0xba: // bts, btr, btc Ev, Ib
		allowed, immLen = m.reg >= 5, 1
	case twoByte:
		return 0, false // xadd, cmpxchg, cmpxchg8b write registers; bt* Ev,Gv reach any memory
	case op < 0x40 && op&0x07 <= 1 && op>>3 != 7: // add, or, adc, sbb, and, sub, xor Eb/Ev, Gb/Gv (not cmp)
		allowed = true
	case op == 0x80, op == 0x83: // group 1 Eb,Ib / Ev,Ib
		allowed, immLen = m.reg != 7, 1
	case op == 0x81: // group 1 Ev,Iz
		allowed, immLen = m.reg != 7, 4
		if opsize {
			immLen = 2
		}
	case op == 0xf6, op == 0xf7: // not, neg
		allowed = m.reg == 2 || m.reg == 3
	case op == 0xfe, op == 0xff: // inc, dec
		allowed = m.reg <= 1
	}
	n := i + m.len + immLen
	if !allowed || n > len(code) {
		return 0, false
	}
	if op >= 0x80 && op <= 0x83 && !twoByte {
		switch m.reg {
		case 0, 1, 5, 6: // add, or, sub, xor
			identity = allZero(code[i+m.len : n])
		}
	}
	if !m.ripRelative && !identity {
		return 0, false
	}
	return n, true
}

func hasSegment(prefixes []byte) bool {
	for _, b := range prefixes {
		switch b {
		case 0x26, 0x2e, 0x36, 0x3e:
			return true
		}
	}
	return false
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// operand is a decoded ModRM operand.
type operand struct {
	len         int  // ModRM, SIB and displacement bytes
	reg         int  // the reg field (opcode extension for groups)
	register    bool // a register operand, not memory
	ripRelative bool
}

// modrm decodes the ModRM byte at code[0] and what follows it (64-bit
// mode, 64-bit addressing; REX.B and REX.X extend base and index
// registers but change no length, and mod 00 with r/m 101 is
// RIP-relative whatever REX.B says).
func modrm(code []byte) (operand, bool) {
	if len(code) == 0 {
		return operand{}, false
	}
	b := code[0]
	mod, reg, rm := b>>6, int(b>>3&7), b&7
	o := operand{len: 1, reg: reg}
	if mod == 3 {
		o.register = true
		return o, true
	}
	if rm == 4 { // SIB
		if len(code) < 2 {
			return operand{}, false
		}
		o.len++
		if mod == 0 && code[1]&7 == 5 { // no base: disp32
			o.len += 4
		}
	}
	switch mod {
	case 0:
		if rm == 5 {
			o.ripRelative = true
			o.len += 4
		}
	case 1:
		o.len++
	case 2:
		o.len += 4
	}
	if o.len > len(code) {
		return operand{}, false
	}
	return o, true
}

// branchesTo reports whether code (the function's bytes, at offset 0 of
// the function) may hold a relative jump, conditional jump, loop or call
// to an offset in [0, to]: a loop back to the start, through a probe moved
// to offset to, would fire it more than once per call. Every byte offset
// is tried, not only instruction starts, so data that looks like a branch
// answers true: conservative.
func branchesTo(code []byte, to int) bool {
	hits := func(at, n int, rel int64) bool {
		target := int64(at+n) + rel
		return target >= 0 && target <= int64(to)
	}
	for i, b := range code {
		rest := code[i:]
		switch {
		case b == 0xeb || b >= 0x70 && b <= 0x7f || b >= 0xe0 && b <= 0xe3: // jmp, jcc, loop, jrcxz rel8
			if len(rest) >= 2 && hits(i, 2, int64(int8(rest[1]))) {
				return true
			}
		case b == 0xe9 || b == 0xe8: // jmp, call rel32
			if len(rest) >= 5 && hits(i, 5, int64(int32(le32(rest[1:])))) {
				return true
			}
		case b == 0x0f: // jcc rel32
			if len(rest) >= 6 && rest[1] >= 0x80 && rest[1] <= 0x8f && hits(i, 6, int64(int32(le32(rest[2:])))) {
				return true
			}
		}
	}
	return false
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
