package uprobe

import (
	"encoding/binary"
	"slices"

	"github.com/profi-dev/profi/internal/elfsym"
	"github.com/profi-dev/profi/internal/status"
)

// The arm64 kernel (arch/arm64/kernel/probes/decode-insn.c) simulates a
// probed instruction only when it is a branch (B.cond, CBZ/CBNZ,
// TBZ/TBNZ, B/BL, BR/BLR/RET), ADR/ADRP, or (6.13 and later) NOP: one
// exception per hit. Every other instruction it accepts is single-stepped
// out of line: two exceptions per hit. That includes the usual function
// entries `bti c`, `paciasp` and `stp x29, x30, [sp, #-N]!`. It refuses
// exclusive loads and stores, literal loads (support removed as broken,
// CVE-2024-50099), MSR and MRS of DAIF, exception-generating instructions,
// hints outside a short list, and addresses not 4-byte aligned
// (docs/PROBES.md, "Probe placement").
//
// The probe stays at the symbol (offset 0) on arm64:
//   - a return probe replaces the return address in x30, so it must fire
//     before `paciasp` signs x30; the entry probe shares its address,
//     one trap site per call;
//   - skipping `bti c` would save an exception only when the next
//     instruction is simulated, which a PAC-protected entry (`paciasp`,
//     stepped, not skippable) never is, and would need a scan for
//     branches back to the moved probe;
//   - a breakpoint replacing `bti c` and reached by an indirect branch
//     was measured to work (docs/PROBES.md).
// A refused first instruction is never offered and never moved past.

// Reasons the arm64 kernel refuses a probed function (/status refused_probes).
const (
	RefusedExclusive   = status.RefusedExclusive
	RefusedLiteralLoad = status.RefusedLiteralLoad
	RefusedSystem      = status.RefusedSystem
	RefusedException   = status.RefusedException
	RefusedHint        = status.RefusedHint
	RefusedBranch      = status.RefusedBranch
	RefusedMOPS        = status.RefusedMOPS
	RefusedUnaligned   = status.RefusedUnaligned
)

// placeARM64 decides where to probe the arm64 function s (at file offset
// addr): at the symbol, refused when the kernel would refuse its first
// instruction, with how the kernel runs it.
func placeARM64(ef *elfsym.File, s elfsym.Symbol, addr uint64) Func {
	fs := Func{Addr: addr}
	if addr%4 != 0 {
		fs.Refused = &Refusal{Reason: RefusedUnaligned}
		return fs
	}
	code, err := ef.Code(s.Value, 4)
	if err != nil {
		return fs // unread: offered, and a refusal found by trying (findRefused)
	}
	entry, why := decodeARM64(binary.LittleEndian.Uint32(code))
	if why != "" {
		fs.Refused = &Refusal{Reason: why, Code: slices.Clone(code)}
		return fs
	}
	fs.Entry = entry
	return fs
}

// is reports whether the instruction w has the fixed bits val under mask.
func is(w, mask, val uint32) bool { return w&mask == val }

// hintSteppable are the hints (CRm:op2 of HINT, bits 11:5) the kernel
// single-steps (aarch64_insn_is_steppable_hint): XPACLRI, PACIA1716,
// PACIB1716, PACIAZ, PACIASP, PACIBZ, PACIBSP, BTI, BTI c, BTI j, BTI jc.
// NOP is simulated; every other hint (AUTIASP, YIELD, WFE...) is refused.
var hintSteppable = map[uint32]bool{
	0x07: true, 0x08: true, 0x0a: true, 0x18: true, 0x19: true, 0x1a: true, 0x1b: true,
	0x20: true, 0x22: true, 0x24: true, 0x26: true,
}

// daif is the system register field (bits 20:5) of MRS Xt, DAIF: op0 3,
// op1 3, CRn 4, CRm 2, op2 1.
const daif = 3<<14 | 3<<11 | 4<<7 | 2<<3 | 1

// decodeARM64 says how the arm64 kernel runs a uprobe on the instruction
// w: entry is EntrySimulated, EntrySimulatedSince (NOP) or EntryStepped;
// refused is why it refuses it ("" when it does not). Encodings: Arm
// Architecture Reference Manual, A64 instruction set encoding.
func decodeARM64(w uint32) (entry, refused string) {
	switch {
	case w == 0xd503201f: // NOP
		return EntrySimulatedSince, ""
	case is(w, 0xff000010, 0x54000000), // B.cond
		is(w, 0x7e000000, 0x34000000), // CBZ, CBNZ
		is(w, 0x7e000000, 0x36000000), // TBZ, TBNZ
		is(w, 0x7c000000, 0x14000000), // B, BL
		is(w, 0xffdffc1f, 0xd61f0000), // BR, BLR
		is(w, 0xfffffc1f, 0xd65f0000), // RET
		is(w, 0x1f000000, 0x10000000): // ADR, ADRP
		return EntrySimulated, ""
	case is(w, 0xff000010, 0x54000010), // BC.cond: a branch stepped at the wrong PC
		is(w, 0xfe000000, 0xd6000000): // other branches (register): BRAA, BLRAA, RETAA, ERET...
		if is(w, 0xfffffbff, 0xd69f03e0) { // ERET, ERETAA, ERETAB
			return "", RefusedSystem
		}
		return "", RefusedBranch
	case is(w, 0xff000000, 0xd4000000): // SVC, HVC, SMC, BRK, HLT, DCPS
		return "", RefusedException
	case is(w, 0xfff8f01f, 0xd500401f), // MSR (immediate)
		is(w, 0xfff00000, 0xd5100000),                        // MSR (register)
		is(w, 0xfff00000, 0xd5300000) && w>>5&0xffff == daif: // MRS Xt, DAIF
		return "", RefusedSystem
	case is(w, 0xfffff01f, 0xd503201f): // HINT
		if hintSteppable[w>>5&0x7f] {
			return EntryStepped, ""
		}
		return "", RefusedHint
	case is(w, 0x3b000000, 0x18000000): // load register (literal): LDR, LDRSW, PRFM, SIMD&FP LDR
		return "", RefusedLiteralLoad
	case is(w, 0x3f800000, 0x08000000): // load/store exclusive (LDXR, STXR, LDAXP, CASP...)
		return "", RefusedExclusive
	case is(w, 0x3b200c00, 0x19000400): // CPY*, SET* (FEAT_MOPS)
		return "", RefusedMOPS
	}
	return EntryStepped, ""
}
