package kernelname

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Label values that are not kernel names (docs/INTERFACE.md §5.2).
const (
	// Anonymous is the `kernel` value in anonymous kernel mode.
	Anonymous = "anonymous"
	// Other is the `kernel` value beyond --max-kernels-per-pid, and the
	// `kernel_class` and `phase` value when no rule matches.
	Other = "other"
	// unknownPrefix starts the `kernel` value of an unresolved address.
	unknownPrefix = "unknown_0x"
	// unknownModulePrefix starts the `kernel` value of an unresolved
	// address inside a mapped file (UnknownIn).
	unknownModulePrefix = "unknown_"
	// maxModuleLen bounds the module part of UnknownIn, so the label
	// stays within MaxNameLen: 8 + 32 + 3 + 16 hex digits.
	maxModuleLen = 32
)

// rule maps substrings of a lowercased name to a label value.
type rule struct {
	value      string
	substrings []string
}

// classRules is the `kernel_class` table of docs/INTERFACE.md §5.2, checked in
// order, first match wins. The order of the classes is part of the
// interface (a name with both "gemm" and "softmax" is a gemm); substrings
// may be added. Additions to the interface's core set are marked.
var classRules = []rule{
	{"attention", []string{"flash_fwd", "paged_attention", "sdpa",
		"flash_bwd", "fmha"}}, // added: FlashAttention backward, xFormers/cuDNN fused MHA
	{"gemm", []string{"gemm", "cutlass", "matmul", "linear",
		"gemv"}}, // added: cuBLAS matrix-vector kernels
	{"collective", []string{"nccl", "allreduce",
		"all_reduce", "allgather", "all_gather", "reduce_scatter", "reducescatter"}}, // added: spelled-out collectives
	{"activation", []string{"softmax", "layernorm", "rms_norm", "gelu", "silu",
		"layer_norm", "rmsnorm", "relu"}}, // added: PyTorch layer_norm kernels, other spellings
	{"memory", []string{"memset", "copy", "transpose",
		"memcpy"}}, // added
	{"sampling", []string{"sampling", "topk", "argmax",
		"top_k", "top_p", "multinomial"}}, // added: vLLM/FlashInfer samplers
}

// phaseRules is the `phase` table of docs/INTERFACE.md §5.2, checked in order on
// the lowercased NVTX range name.
var phaseRules = []rule{
	{"prefill", []string{"prefill", "prompt", "encode"}},
	{"decode", []string{"decode", "generate"}},
	{"attention", []string{"attention", "attn"}},
	{"mlp", []string{"mlp", "ffn", "expert"}},
	{"norm", []string{"norm", "embed"}},
}

// match returns the value of the first rule with a substring in lowered,
// or Other.
func match(rules []rule, lowered string) string {
	for _, r := range rules {
		for _, sub := range r.substrings {
			if strings.Contains(lowered, sub) {
				return r.value
			}
		}
	}
	return Other
}

// Class returns the `kernel_class` of a normalized kernel name: the first
// class of the interface's ordered substring table (attention, gemm,
// collective, activation, memory, sampling) with a substring in the
// lowercased name, or "other". The placeholders "", "anonymous", "other"
// and "unknown_0x…" are not names and are always "other".
func Class(name string) string {
	if name == "" || name == Anonymous || name == Other || IsUnknown(name) {
		return Other
	}
	return match(classRules, strings.ToLower(name))
}

// Phase returns the `phase` of an NVTX range name: prefill, decode,
// attention, mlp or norm by the interface's ordered substring table on the
// lowercased name, "other" for a range that matches nothing, and "" for no
// range (rangeName ""). The label is the phase of the innermost open range
// whose Phase is not "other", or "other" if none is.
func Phase(rangeName string) string {
	if rangeName == "" {
		return ""
	}
	return match(phaseRules, strings.ToLower(rangeName))
}

// Unknown returns the `kernel` value of an address whose name is not known
// (yet) and that lies in no mapped file: "unknown_0x" and the address in
// lowercase hex without padding.
func Unknown(addr uint64) string {
	return unknownPrefix + strconv.FormatUint(addr, 16)
}

// UnknownIn returns the `kernel` value of an unnamed address inside a
// mapped file: "unknown_", the file's base name (module, made label-safe
// and cut to 32 bytes), "+0x" and the offset in the file in lowercase hex.
// Unlike the address, which ASLR moves on every run, it is the same for
// the same function of the same file in every process, so pod churn does
// not mint new series.
func UnknownIn(module string, offset uint64) string {
	var b strings.Builder
	b.WriteString(unknownModulePrefix)
	n := 0
	for _, r := range module {
		if r == utf8.RuneError || unicode.IsControl(r) || r == '+' {
			r = '?'
		}
		if n+utf8.RuneLen(r) > maxModuleLen {
			break
		}
		n += utf8.RuneLen(r)
		b.WriteRune(r)
	}
	b.WriteString("+0x")
	b.WriteString(strconv.FormatUint(offset, 16))
	return b.String()
}

// IsUnknown reports whether name is a placeholder of Unknown or UnknownIn.
func IsUnknown(name string) bool {
	if strings.HasPrefix(name, unknownPrefix) {
		return true
	}
	rest, ok := strings.CutPrefix(name, unknownModulePrefix)
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, "+0x")
	if i < 0 || i+3 == len(rest) {
		return false
	}
	for _, c := range rest[i+3:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
