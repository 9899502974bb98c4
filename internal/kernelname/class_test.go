package kernelname

import (
	"strings"
	"testing"
)

func TestClass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, kernel, want string
	}{
		// One per core substring of docs/INTERFACE.md §5.2.
		{"flash_fwd", "flash::flash_fwd_kernel", "attention"},
		{"flash_fwd splitkv", "flash_fwd_splitkv_combine_kernel", "attention"},
		{"paged_attention", "vllm::paged_attention_v1_kernel", "attention"},
		{"sdpa", "pytorch_sdpa_fwd", "attention"},
		{"gemm", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "gemm"},
		{"cutlass", "cutlass::Kernel2", "gemm"},
		{"matmul", "triton_tem_fused_matmul", "gemm"},
		{"linear", "fused_linear_kernel", "gemm"},
		{"nccl", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"},
		{"allreduce", "vllm::cross_device_allreduce_1stage", "collective"},
		{"softmax", "at::native::(anonymous namespace)::cunn_SoftMaxForward", "activation"},
		{"layernorm", "LayerNormKernel", "activation"},
		{"rms_norm", "vllm::rms_norm_kernel", "activation"},
		{"gelu", "triton_poi_fused_gelu", "activation"},
		{"silu", "vllm::silu_and_mul_kernel", "activation"},
		{"memset", "memset_kernel", "memory"},
		{"copy", "at::native::direct_copy_kernel_cuda", "memory"},
		{"transpose", "batch_transpose_kernel", "memory"},
		{"sampling", "flashinfer::sampling::TopKSamplingFromProbKernel", "sampling"},
		{"topk", "at::native::sbtopk::gatherTopK", "sampling"},
		{"argmax", "argmax_kernel", "sampling"},
		// Additions.
		{"fmha", "fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention"},
		{"gemv", "gemv2T_kernel_val", "gemm"},
		{"layer_norm", "at::native::vectorized_layer_norm_kernel", "activation"},
		{"top_p", "top_p_renorm_kernel", "sampling"},
		// Order: the first class in table order wins, whatever the
		// position of the substring in the name.
		{"gemm before softmax", "fused_softmax_gemm", "gemm"},
		{"attention before gemm", "flash_fwd_cutlass_gemm", "attention"},
		{"collective before memory", "nccl_copy", "collective"},
		{"activation before memory", "softmax_copy", "activation"},
		{"memory before sampling", "transpose_topk", "memory"},
		// Case-insensitive.
		{"upper case", "SGEMM_KERNEL", "gemm"},
		// Not names.
		{"empty", "", "other"},
		{"anonymous", "anonymous", "other"},
		{"other", "other", "other"},
		{"unknown", "unknown_0x7f3a2c010000", "other"},
		{"no match", "triton_poi_fused_add", "other"},
		{"anonymous namespace is not anonymous", "(anonymous namespace)::foo", "other"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Class(tc.kernel); got != tc.want {
				t.Errorf("Class(%q) = %q, want %q", tc.kernel, got, tc.want)
			}
		})
	}
}

// TestClassTableOrder pins the class order of docs/INTERFACE.md §5.2, which is
// an interface: reordering changes labels.
func TestClassTableOrder(t *testing.T) {
	t.Parallel()
	want := []string{"attention", "gemm", "collective", "activation", "memory", "sampling"}
	if len(classRules) != len(want) {
		t.Fatalf("%d classes, want %d", len(classRules), len(want))
	}
	for i, r := range classRules {
		if r.value != want[i] {
			t.Errorf("class %d = %q, want %q", i, r.value, want[i])
		}
		for _, sub := range r.substrings {
			if got := Class(sub); got != r.value {
				t.Errorf("Class(%q) = %q, want %q (shadowed by an earlier class)", sub, got, r.value)
			}
		}
	}
}

func TestPhase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, rng, want string
	}{
		{"no range", "", ""},
		{"prefill", "vllm.prefill", "prefill"},
		{"prompt", "Prompt processing", "prefill"},
		{"encode", "encoder_forward", "prefill"},
		{"decode", "decode_step", "decode"},
		{"generate", "model.generate", "decode"},
		{"attention", "LlamaAttention.forward", "attention"},
		{"attn", "self_attn", "attention"},
		{"mlp", "LlamaMLP", "mlp"},
		{"ffn", "ffn_up", "mlp"},
		{"expert", "moe_expert_7", "mlp"},
		{"norm", "input_layernorm", "norm"},
		{"embed", "embed_tokens", "norm"},
		{"other", "optimizer.step", "other"},
		{"white space is a range", " ", "other"},
		// Order.
		{"prefill before attention", "prefill_attention", "prefill"},
		{"decode before mlp", "mlp_decode", "decode"},
		{"attention before norm", "attn_norm", "attention"},
		{"mlp before norm", "post_mlp_norm", "mlp"},
		{"encode is prefill, not decode", "encode_decode", "prefill"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Phase(tc.rng); got != tc.want {
				t.Errorf("Phase(%q) = %q, want %q", tc.rng, got, tc.want)
			}
		})
	}
}

func TestUnknown(t *testing.T) {
	t.Parallel()
	for addr, want := range map[uint64]string{
		0:                  "unknown_0x0",
		0x7f3a2c010000:     "unknown_0x7f3a2c010000",
		0xffffffffffffffff: "unknown_0xffffffffffffffff",
	} {
		if got := Unknown(addr); got != want {
			t.Errorf("Unknown(%#x) = %q, want %q", addr, got, want)
		}
		if got := Normalize(Unknown(addr)); got != want {
			t.Errorf("Normalize(%q) = %q, want it unchanged", want, got)
		}
		if got := Class(Unknown(addr)); got != Other {
			t.Errorf("Class(%q) = %q, want other", want, got)
		}
	}
}

// UnknownIn names an address by module and file offset: label-safe,
// bounded, never classified by the module's name.
func TestUnknownIn(t *testing.T) {
	for _, tc := range []struct {
		module string
		off    uint64
		want   string
	}{
		{"libfoo.so", 0x1234, "unknown_libfoo.so+0x1234"},
		{"libnccl.so.2", 0, "unknown_libnccl.so.2+0x0"},
		{"a+b\xff\n", 0x10, "unknown_a?b??+0x10"},
		{strings.Repeat("x", 100), 0xffffffffffffffff, "unknown_" + strings.Repeat("x", 32) + "+0xffffffffffffffff"},
	} {
		got := UnknownIn(tc.module, tc.off)
		if got != tc.want {
			t.Errorf("UnknownIn(%q, %#x) = %q, want %q", tc.module, tc.off, got, tc.want)
		}
		if len(got) > MaxNameLen {
			t.Errorf("UnknownIn(%q) is %d bytes, over %d", tc.module, len(got), MaxNameLen)
		}
		if !IsUnknown(got) || Class(got) != Other {
			t.Errorf("%q: IsUnknown %v, Class %q; want true, other", got, IsUnknown(got), Class(got))
		}
	}
	for _, name := range []string{"unknown_kernel", "unknown_libfoo.so+0x", "unknown_x+0xZZ", "gemm_kernel"} {
		if IsUnknown(name) {
			t.Errorf("IsUnknown(%q) = true", name)
		}
	}
	if Class("unknown_gemm_kernel") != "gemm" {
		t.Error("a real kernel named unknown_… lost its class")
	}
}
