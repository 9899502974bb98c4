package kernelname

import (
	"strconv"
	"strings"
	"testing"
)

// Manglings below were produced by g++ 12 from declarations shaped like the
// real kernels (same namespaces, template parameters and parameter types);
// nvcc mangles __global__ functions the same way.
var normalizeCases = []struct {
	name, raw, want string
}{
	// FlashAttention 2.
	{"flash-attn mangled",
		"_ZN5flash16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi64ELi64ELi4ELb0ELb0EN7cutlass10bfloat16_tE19Flash_kernel_traitsILi128ELi64ELi64ELi4ES3_EELb0ELb1ELb0ELb0ELb1ELb1ELb0ELb0EEEvNS_16Flash_fwd_paramsE",
		"flash::flash_fwd_kernel"},
	{"flash-attn demangled with return type",
		"void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(Flash_fwd_params)",
		"flash_fwd_kernel"},
	// CUTLASS and cuBLAS.
	{"cutlass Kernel2",
		"_ZN7cutlass7Kernel2I57cutlass_80_tensorop_s1688gemm_bf16_256x128_32x3_tn_align8EEvNT_6ParamsE",
		"cutlass::Kernel2"},
	{"cuBLAS plain name",
		"ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn",
		"ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"},
	{"cuBLAS sm90 name cut at 64 bytes",
		"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
		"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warp"},
	// PyTorch.
	{"pytorch vectorized_elementwise_kernel",
		"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
		"at::native::vectorized_elementwise_kernel"},
	{"pytorch anonymous namespace",
		"_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardILi4EfffNS1_22SoftMaxForwardEpilogueEEEvPT2_PKT0_i",
		"at::native::(anonymous namespace)::cunn_SoftMaxForward"},
	{"pytorch anonymous namespace demangled",
		"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
		"at::native::(anonymous namespace)::cunn_SoftMaxForward"},
	{"pytorch lambdas in template arguments",
		"_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kernel_cudaERNS0_18TensorIteratorBaseEENKUlvE_clEvENKUlvE_clEvEUlfE_EEvS4_RKT_EUliE_EEviT1_",
		"at::native::elementwise_kernel"},
	{"pytorch lambdas demangled",
		"void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})",
		"at::native::elementwise_kernel"},
	{"lambda call operator",
		"_ZZNK1S1mEvENKUliE_clEi",
		"S::m::{lambda(int)#1}::operator()"},
	{"lambda call operator demangled",
		"S::m() const::{lambda(int)#1}::operator()(int) const",
		"S::m::{lambda(int)#1}::operator()"},
	{"nested lambda cut before an open brace",
		"_ZZZN2at6native23direct_copy_kernel_cudaERNS0_18TensorIteratorBaseEENKUlvE_clEvENKUlvE_clEv",
		"at::native::direct_copy_kernel_cuda::{lambda()#1}::operator()"},
	// Triton.
	{"triton suffix", "triton_poi_fused_add_0", "triton_poi_fused_add"},
	{"triton two-digit suffix", "triton_red_fused__softmax_12", "triton_red_fused__softmax"},
	{"triton layer norm", "triton_per_fused_native_layer_norm_3", "triton_per_fused_native_layer_norm"},
	{"repeated suffixes", "kernel_1_2", "kernel"},
	{"digits without underscore kept", "gemv2T_kernel_val2", "gemv2T_kernel_val2"},
	{"suffix alone kept", "_0", "_0"},
	{"suffix after scope kept", "ns::_12", "ns::_12"},
	// vLLM.
	{"vllm paged_attention_v1_kernel",
		"_ZN4vllm25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0ELi0EEEvPT_PKS2_PKT0_if",
		"vllm::paged_attention_v1_kernel"},
	{"vllm paged_attention_v1_kernel demangled",
		"void vllm::paged_attention_v1_kernel<unsigned short, unsigned short, 128, 16, 128, (vllm::Fp8KVCacheDataType)0, false, 0>(unsigned short*, unsigned short const*, unsigned short const*, int, float)",
		"vllm::paged_attention_v1_kernel"},
	{"vllm function pointer template argument",
		"_ZN4vllm18act_and_mul_kernelIfXadL_ZNS_11silu_kernelIfEET_RKS2_EELb1EEEvPS2_PS3_i",
		"vllm::act_and_mul_kernel"},
	// Other demangler output.
	{"clone suffix", "_Z3fooi.cold", "foo"},
	{"isra clone", "_Z3fooi.isra.0", "foo"},
	{"abi tag", "_ZN3foo3barB5cxx11Ev", "foo::bar"},
	{"operator less", "_ZN1AltES_", "A::operator<"},
	{"operator shift", "_ZN1AlsEi", "A::operator<<"},
	{"operator call", "_ZN1AclEv", "A::operator()"},
	{"conversion operator", "_ZN1AcviEv", "A::operator int"},
	{"destructor", "_ZN1AD1Ev", "A::~A"},
	{"nvcc device stub", "__device_stub__Z3fooi", "foo"},
	{"C device stub kept", "__device_stub__foo", "__device_stub__foo"},
	{"special name", "_ZTV1A", "A"},
	{"rust legacy", "_ZN3foo3bar17h0123456789abcdefE", "foo::bar"},
	{"rust v0", "_RNvCs1234_7mycrate3foo", "mycrate::foo"},
	// Demangled signatures.
	{"qualifiers", "void foo(int) const &&", "foo"},
	{"noexcept", "foo() noexcept", "foo"},
	{"clone suffix demangled", "foo(int) [clone .cold]", "foo"},
	{"comparison in template argument", "std::enable_if<(N>0), void>::type foo<3>(int)", "foo"},
	{"function returning function pointer", "void (*fptr(int))(float)", "fptr"},
	{"local name", "foo(int)::bar", "foo::bar"},
	// Malformed manglings are kept as they are.
	{"bare prefix", "_Z", "_Z"},
	{"unterminated nested name", "_ZN3foo", "_ZN3foo"},
	{"length past the end", "_Z999foo", "_Z999foo"},
	{"short source name", "_ZN", "_ZN"},
	{"not a mangling", "_Zero_kernel", "_Zero_kernel"},
	{"corrupt parameters keep the name", "_Z3fooXYZ", "foo"},
	{"truncated parameters keep the name",
		"_ZN4vllm25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0ELi0EEEvPT_PK",
		"vllm::paged_attention_v1_kernel"},
	{"truncated template arguments kept raw",
		"_ZN4vllm25paged_attention_v1_kernelIttLi128ELi16",
		"_ZN4vllm25paged_attention_v1_kernelIttLi128ELi16"},
	// Placeholders and odd input.
	{"empty", "", ""},
	{"spaces", "   ", ""},
	{"only parameters", "(int, float)", ""},
	{"only template arguments", "<int>", ""},
	{"surrounding white space", "\t triton_poi_fused_add_0 \n", "triton_poi_fused_add"},
	{"invalid UTF-8 and control characters", "a\x00b\xff\xfec", "a\uFFFDb\uFFFDc"},
	{"anonymous", "anonymous", "anonymous"},
	{"unknown placeholder", "unknown_0x7f3a2c010000", "unknown_0x7f3a2c010000"},
	// Long names.
	{"long identifier", strings.Repeat("k", 200), strings.Repeat("k", MaxNameLen)},
	{"cut on a rune boundary", "a" + strings.Repeat("ä", 40), "a" + strings.Repeat("ä", 31)},
	{"cut uncovers a suffix", strings.Repeat("a", 60) + "_123456_x", strings.Repeat("a", 60)},
	{"anonymous namespace function",
		"_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardEv",
		"at::native::(anonymous namespace)::cunn_SoftMaxForward"},
	{"cut through the anonymous namespace",
		"void some_rather_long_namespace::another_namespace::(anonymous namespace)::kernel<1>(int)",
		"some_rather_long_namespace::another_namespace::(anonymous namesp"},
	{"long mangled name",
		"_ZN" + strings.Repeat("10abcdefghij", 10) + "6kernelEv",
		strings.Repeat("abcdefghij::", 5) + "abcd"},
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	for _, tc := range normalizeCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Normalize(tc.raw)
			if got != tc.want {
				t.Errorf("Normalize(%q)\n got %q\nwant %q", tc.raw, got, tc.want)
			}
			if again := Normalize(got); again != got {
				t.Errorf("Normalize(%q) = %q, not idempotent", got, again)
			}
		})
	}
}

// TestNormalizeNestedManglings checks idempotence where every pass
// uncovers another mangling: _Z4_Z1a names "_Z1a", which names "a".
func TestNormalizeNestedManglings(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		nested(3), nested(20),
		// One pass cuts this to 64 bytes that are a deep nesting again.
		strings.Repeat("x", 100) + "::" + nested(20) + "<int>",
	} {
		got := Normalize(raw)
		if again := Normalize(got); again != got {
			t.Errorf("Normalize(%q) = %q, but Normalize(%q) = %q", raw, got, got, again)
		}
	}
	// 15 levels fit in MaxNameLen and are all undone; deeper ones are cut
	// to 64 bytes first, which leaves an invalid mangling.
	if got := Normalize(nested(15)); got != "a" {
		t.Errorf("Normalize(%q) = %q, want %q", nested(15), got, "a")
	}
}

// nested returns "a" mangled depth times as a source name: _Z1a, _Z4_Z1a…
func nested(depth int) string {
	s := "a"
	for range depth {
		s = "_Z" + strconv.Itoa(len(s)) + s
	}
	return s
}

// TestNormalizeHostile checks that pathological input stays cheap and
// bounded: deep nesting, huge strings, manglings whose expansion is
// exponential.
func TestNormalizeHostile(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		strings.Repeat("<", 1<<16),
		strings.Repeat("(", 1<<16) + "x",
		strings.Repeat("{", 1<<16),
		strings.Repeat("a<", 1<<15) + "b",
		"_Z" + strings.Repeat("1a", 1<<14),
		// Each S_ doubles the output of the one before.
		"_Z1fIiEvT_" + strings.Repeat("S_", 64),
		"_ZN1fIJ" + strings.Repeat("S_", 200) + "EEEvv",
		strings.Repeat("x", 1<<20),
	} {
		got := Normalize(raw)
		if len(got) > MaxNameLen {
			t.Errorf("Normalize(%.20q…) = %q: too long", raw, got)
		}
	}
}

func BenchmarkNormalize(b *testing.B) {
	raw := normalizeCases[0].raw
	b.ReportAllocs()
	for b.Loop() {
		Normalize(raw)
	}
}
