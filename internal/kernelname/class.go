package kernelname

import (
	"strconv"
	"strings"
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
	if name == "" || name == Anonymous || name == Other || strings.HasPrefix(name, unknownPrefix) {
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
// (yet): "unknown_0x" and the address in lowercase hex without padding.
func Unknown(addr uint64) string {
	return unknownPrefix + strconv.FormatUint(addr, 16)
}
