package testutil

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

var (
	sharedOnce sync.Once
	sharedFx   *Fixtures
	sharedErr  error
	sharedDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

// fixtures builds once per test binary: most tests only need to run them.
func fixtures(t *testing.T) *Fixtures {
	t.Helper()
	sharedOnce.Do(func() {
		if sharedDir, sharedErr = os.MkdirTemp("", "profi-testutil-"); sharedErr == nil {
			sharedFx, sharedErr = BuildFixtures(sharedDir)
		}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedFx
}

var graphFuncs = []string{"cudaGraphLaunch", "cudaGraphInstantiate", "cudaGraphLaunch_ptsz"}

// registerFuncs are the runtime's kernel registration entry points.
var registerFuncs = []string{"__cudaRegisterFatBinary", "__cudaRegisterFunction", "__cudaUnregisterFatBinary"}

// cuda13Funcs are the launch entry points CUDA 13.0's runtime adds (nvcc 13
// lowers kernel<<<...>>> to them); only the libcudart.so.13 stub has them.
var cuda13Funcs = []string{"__cudaGetKernel", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz"}

// captureFuncs are the runtime's stream capture, event and graph
// construction functions (CUDA 12.4+ and 13.0), in every runtime build.
var captureFuncs = []string{
	"cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz", "cudaStreamBeginCaptureToGraph",
	"cudaStreamBeginCaptureToGraph_ptsz", "cudaStreamEndCapture", "cudaStreamEndCapture_ptsz",
	"cudaStreamIsCapturing", "cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventDestroy",
	"cudaEventRecord", "cudaEventRecord_ptsz", "cudaEventRecordWithFlags", "cudaEventRecordWithFlags_ptsz",
	"cudaStreamWaitEvent", "cudaStreamWaitEvent_ptsz", "cudaGraphCreate", "cudaGraphInstantiateWithFlags",
	"cudaGraphInstantiateWithParams", "cudaGraphInstantiateWithParams_ptsz", "cudaGraphExecUpdate",
	"cudaGraphExecDestroy", "cudaGraphDestroy", "cudaGraphAddKernelNode", "cudaGraphAddMemcpyNode",
	"cudaGraphAddMemcpyNode1D", "cudaGraphAddMemsetNode", "cudaGraphAddChildGraphNode",
}

// driverGraphFuncs are the driver stub's stream capture, event and graph
// functions (PROFI_CU_GRAPH_FUNCS in cuda_drv_stub.h).
var driverGraphFuncs = []string{
	"cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2",
	"cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz",
	"cuStreamEndCapture", "cuStreamEndCapture_ptsz", "cuStreamIsCapturing", "cuStreamIsCapturing_ptsz",
	"cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuEventCreate", "cuEventDestroy_v2",
	"cuEventRecord", "cuEventRecord_ptsz", "cuEventRecordWithFlags", "cuEventRecordWithFlags_ptsz",
	"cuStreamWaitEvent", "cuStreamWaitEvent_ptsz", "cuGraphCreate", "cuGraphDestroy", "cuGraphInstantiate",
	"cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
	"cuGraphInstantiateWithParams_ptsz", "cuGraphExecUpdate", "cuGraphExecUpdate_v2", "cuGraphExecDestroy",
	"cuGraphAddKernelNode", "cuGraphAddKernelNode_v2", "cuGraphAddMemcpyNode", "cuGraphAddMemsetNode",
	"cuGraphAddChildGraphNode", "cuGraphGetNodes", "cuGraphNodeGetType", "cuGetExportTable",
}

// exportedFuncs are all functions the runtime stub defines and exports.
var exportedFuncs = slices.Concat(ProbedFuncs, ExtraFuncs, PtszFuncs, registerFuncs, captureFuncs,
	[]string{"cudaStreamCreate", "cudaGetLastError", "cudaGetDeviceCount"})

// driverExports are all functions the driver stub defines and exports.
var driverExports = slices.Concat(DriverFuncs, []string{"cuLaunchKernel_ptsz", "cuGraphLaunch",
	"cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch_ptsz"}, driverMemFuncs,
	driverGraphFuncs)

// driverMemFuncs are the driver memory API functions the stub exports
// (PROFI_CU_MEM_FUNCS in cuda_drv_stub.h).
var driverMemFuncs = []string{
	"cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocManaged",
	"cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2",
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyPeer",
	"cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyAsync_ptsz", "cuMemsetD8_v2", "cuMemsetD16_v2",
	"cuMemsetD32_v2", "cuMemsetD32Async", "cuMemsetD2D8_v2", "cuMemsetD2D16_v2", "cuMemsetD2D32_v2",
	"cuMemsetD2D32Async", "cuMemcpy2D_v2", "cuMemcpy2DUnaligned_v2", "cuMemcpy2DAsync_v2", "cuMemcpy3D_v2",
	"cuMemcpy3DAsync_v2", "cuMemcpy3DPeer", "cuMemcpy3DPeerAsync", "cuMemAllocPitch_v2", "cuMemAllocFromPoolAsync",
	"cuMemCreate", "cuMemRelease", "cuMemAddressReserve",
	"cuMemAddressFree", "cuMemMap", "cuMemUnmap",
}

// runtimeImports are the driver functions the runtime stub calls.
var runtimeImports = []string{
	"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
	"cuGraphLaunch",
}

// dynFuncs returns the global functions path defines in .dynsym (CUDA names only).
// funcCode returns the code of each exported CUDA function of lib, from
// its symbol to the end of .text.
func funcCode(t *testing.T, lib string) map[string][]byte {
	t.Helper()
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	data, err := text.Data()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for name, s := range dynFuncs(t, lib) {
		if off := s.Value - text.Addr; s.Value >= text.Addr && off < uint64(len(data)) {
			out[name] = data[off:]
		}
	}
	return out
}

func dynFuncs(t *testing.T, path string) map[string]elf.Symbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]elf.Symbol{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF &&
			elf.ST_BIND(s.Info) == elf.STB_GLOBAL && isCUDAName(s.Name) {
			out[s.Name] = s
		}
	}
	return out
}

// dynImports returns the undefined CUDA symbols path's .dynsym refers to.
func dynImports(t *testing.T, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF && isCUDAName(s.Name) {
			out = append(out, s.Name)
		}
	}
	return out
}

func isCUDAName(name string) bool {
	return strings.HasPrefix(name, "cu") || strings.HasPrefix(name, "__cuda")
}

func dynStrings(t *testing.T, path string, tag elf.DynTag) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := f.DynString(tag)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStubELF(t *testing.T) {
	fx := fixtures(t)
	if got := dynStrings(t, fx.Cuda, elf.DT_SONAME); len(got) != 1 || got[0] != "libcuda.so.1" {
		t.Errorf("%s: SONAME %q, want libcuda.so.1", fx.Cuda, got)
	}
	for _, lib := range []string{fx.Cudart, fx.CudartMissing} {
		if got := dynStrings(t, lib, elf.DT_SONAME); len(got) != 1 || got[0] != "libcudart.so.12" {
			t.Errorf("%s: SONAME %q, want libcudart.so.12", lib, got)
		}
		// The runtime reaches the driver as the real one does, and finds
		// it from anywhere (tests copy the runtime elsewhere).
		if got := dynStrings(t, lib, elf.DT_NEEDED); !contains(got, "libcuda.so.1") {
			t.Errorf("%s: NEEDED %q lacks libcuda.so.1", lib, got)
		}
		if got := dynStrings(t, lib, elf.DT_RUNPATH); !contains(got, fx.Dir) {
			t.Errorf("%s: RUNPATH %q, want %s", lib, got, fx.Dir)
		}
		// A driver function defined in the runtime would take the calls.
		for name := range dynFuncs(t, lib) {
			if strings.HasPrefix(name, "cu") && !strings.HasPrefix(name, "cuda") {
				t.Errorf("%s defines driver function %s", lib, name)
			}
		}
	}
	for _, name := range runtimeImports {
		if got := dynImports(t, fx.Cudart); !contains(got, name) {
			t.Errorf("%s does not import %s (imports %q)", fx.Cudart, name, got)
		}
	}

	for lib, names := range map[string][]string{fx.Cudart: exportedFuncs, fx.Cudart13: slices.Concat(exportedFuncs, cuda13Funcs),
		fx.Cuda: driverExports} {
		syms := dynFuncs(t, lib)
		addrs := map[uint64]string{}
		for _, name := range names {
			s, ok := syms[name]
			if !ok {
				t.Errorf("%s does not export %s", lib, name)
				continue
			}
			// -fno-ipa-icf: one probe site per function, never shared.
			if other, dup := addrs[s.Value]; dup {
				t.Errorf("%s: %s and %s share address %#x", lib, name, other, s.Value)
			}
			addrs[s.Value] = name
		}
	}

	for _, name := range cuda13Funcs {
		if _, ok := dynFuncs(t, fx.Cudart)[name]; ok {
			t.Errorf("%s (CUDA 12) exports CUDA 13's %s", fx.Cudart, name)
		}
	}
	if got := dynStrings(t, fx.Cudart13, elf.DT_SONAME); len(got) != 1 || got[0] != "libcudart.so.13" {
		t.Errorf("%s: SONAME %q, want libcudart.so.13", fx.Cudart13, got)
	}
	// Like NVIDIA's runtimes, every export is versioned with the SONAME.
	for lib, version := range map[string]string{fx.Cudart: "libcudart.so.12", fx.Cudart13: "libcudart.so.13"} {
		f, err := elf.Open(lib)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := f.DynamicSymbols()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, sym := range syms {
			if sym.Section == elf.SHN_UNDEF || !isCUDAName(sym.Name) || !strings.HasPrefix(sym.Name, "cuda") && !strings.HasPrefix(sym.Name, "__cuda") {
				continue
			}
			n++
			if sym.Version != version {
				t.Errorf("%s: %s has version %q, want %s", lib, sym.Name, sym.Version, version)
			}
		}
		if n < len(exportedFuncs) {
			t.Errorf("%s: %d runtime exports, want at least %d", lib, n, len(exportedFuncs))
		}
	}

	missing := dynFuncs(t, fx.CudartMissing)
	for _, name := range exportedFuncs {
		_, ok := missing[name]
		if want := !contains(graphFuncs, name); ok != want {
			t.Errorf("%s: exports %s = %v, want %v", fx.CudartMissing, name, ok, want)
		}
	}

	if f, err := elf.Open(fx.CudartNotELF); err == nil {
		f.Close()
		t.Errorf("%s opens as ELF", fx.CudartNotELF)
	}
}

// The fixed flags exist to give every probed function the same first
// instruction; catch a compiler or source change that breaks that.
func TestStubFirstInstruction(t *testing.T) {
	fx := fixtures(t)
	for lib, names := range map[string][]string{
		fx.Cudart:   slices.Concat(ProbedFuncs, ExtraFuncs, PtszFuncs, registerFuncs, captureFuncs),
		fx.Cudart13: slices.Concat(ProbedFuncs, ExtraFuncs, PtszFuncs, registerFuncs, captureFuncs, cuda13Funcs[:1]),
		fx.CudartMissing: slices.Concat(ExtraFuncs, registerFuncs, captureFuncs,
			slices.DeleteFunc(slices.Clone(PtszFuncs), func(fn string) bool { return contains(graphFuncs, fn) })),
		fx.Cuda: driverExports,
	} {
		code := funcCode(t, lib)
		for _, name := range names {
			c, ok := code[name]
			if !ok {
				t.Errorf("%s does not export %s", lib, name)
				continue
			}
			// push %rbp; then mov %rsp,%rbp may be scheduled later.
			if len(c) == 0 || c[0] != 0x55 {
				t.Errorf("%s: %s does not start with push %%rbp (0x55): % x", lib, name, c[:min(8, len(c))])
			}
		}
	}
}

// CUDA 13's __cudaLaunchKernel[_ptsz] tail-jump to cudaLaunchKernel[_ptsz]
// in one frame, as NVIDIA's do (test/stubs/cudart.c, TAIL_LAUNCH): no push,
// the handle turned into the function, then a jump through the PLT.
func TestStubTailLaunch(t *testing.T) {
	fx := fixtures(t)
	code := funcCode(t, fx.Cudart13)
	// test %rdi,%rdi; je +13; movabs $KERNEL_HANDLE_XOR,%r11; xor %r11,%rdi; jmp PLT
	want := []byte{0x48, 0x85, 0xff, 0x74, 0x0d, 0x49, 0xbb}
	for _, name := range cuda13Funcs[1:] {
		c, ok := code[name]
		if !ok {
			t.Fatalf("%s does not export %s", fx.Cudart13, name)
		}
		if len(c) < 23 || !bytes.HasPrefix(c, want) || c[18] != 0xe9 {
			t.Errorf("%s: %s is not the tail jump: % x", fx.Cudart13, name, c[:min(25, len(c))])
		}
	}
}

// The locked variants differ from the plain runtime in cudaGraphLaunch's
// first instruction only: a lock-prefixed one (refused by the kernel's
// uprobes), then a jump to the usual body.
func TestStubLockedGraph(t *testing.T) {
	fx := fixtures(t)
	for lib, want := range map[string][]byte{
		fx.CudartLocked:        {0xf0, 0x0f, 0xc1, 0x0d}, // lock xadd %ecx, disp32(%rip)
		fx.CudartLockedMovable: {0xf0, 0xff, 0x05},       // lock incl disp32(%rip)
	} {
		code := funcCode(t, lib)
		for _, name := range slices.Concat(ProbedFuncs, ExtraFuncs, PtszFuncs) {
			c, ok := code[name]
			if !ok || len(c) < 8 {
				t.Errorf("%s does not export %s", lib, name)
				continue
			}
			switch {
			case name == "cudaGraphLaunch" && !bytes.HasPrefix(c, want):
				t.Errorf("%s: %s starts % x, want % x", lib, name, c[:8], want)
			case name != "cudaGraphLaunch" && c[0] != 0x55:
				t.Errorf("%s: %s does not start with push %%rbp (0x55): % x", lib, name, c[:8])
			}
		}
	}
}

func TestWorkloadELF(t *testing.T) {
	fx := fixtures(t)
	needed := dynStrings(t, fx.Workload, elf.DT_NEEDED)
	if !contains(needed, "libcudart.so.12") {
		t.Errorf("linked workload NEEDED %q lacks libcudart.so.12", needed)
	}
	// The driver must come in as the runtime's dependency, through its RUNPATH.
	if contains(needed, "libcuda.so.1") {
		t.Errorf("linked workload NEEDED %q has libcuda.so.1", needed)
	}
	runpath := append(dynStrings(t, fx.Workload, elf.DT_RUNPATH), dynStrings(t, fx.Workload, elf.DT_RPATH)...)
	if !contains(runpath, fx.Dir) {
		t.Errorf("linked workload RUNPATH %q, want %s", runpath, fx.Dir)
	}
	if got := dynStrings(t, fx.WorkloadDlopen, elf.DT_NEEDED); contains(got, "libcudart.so.12") || contains(got, "libcuda.so.1") {
		t.Errorf("dlopen workload links CUDA: NEEDED %q", got)
	}

	// Kernel host stubs: in .dynsym (-rdynamic) and .symtab, at one address.
	for _, bin := range []string{fx.Workload, fx.WorkloadDlopen} {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		dyn, err := f.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		static, err := f.Symbols()
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v (stripped?)", bin, err)
		}
		addr := func(syms []elf.Symbol, name string) uint64 {
			for _, s := range syms {
				if s.Name == name && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
					return s.Value
				}
			}
			return 0
		}
		seen := map[uint64]bool{}
		for _, name := range RuntimeKernels {
			d, st := addr(dyn, name), addr(static, name)
			if d == 0 || d != st || seen[d] {
				t.Errorf("%s: %s at %#x in .dynsym, %#x in .symtab; want one distinct address in both", bin, name, d, st)
			}
			seen[d] = true
		}
	}
}

// Kernel names must be valid Itanium manglings, or a symbolizer would show
// them raw: check with c++filt where present.
func TestKernelNamesDemangle(t *testing.T) {
	filt, err := exec.LookPath("c++filt")
	if err != nil {
		t.Skip("c++filt not found")
	}
	want := map[string]string{
		RuntimeKernels[0]: "void flash::flash_fwd_kernel<128, 64>(float const*, float*, int)",
		RuntimeKernels[1]: "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x3_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x3_tn_align8::Params)",
		RuntimeKernels[2]: "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
		RuntimeKernels[3]: "void rms_norm_kernel<float>(float*, float const*, int)",
		DriverKernels[0]:  DriverKernels[0], // Triton names are plain C
		DriverKernels[1]:  DriverKernels[1],
		DriverKernels[2]:  "paged_attention(float*, float*, int)",
	}
	for name, demangled := range want {
		out, err := exec.Command(filt, name).Output()
		if err != nil {
			t.Fatalf("%s %s: %v", filt, name, err)
		}
		if got := strings.TrimSpace(string(out)); got != demangled {
			t.Errorf("%s demangles to\n  %s\nwant\n  %s", name, got, demangled)
		}
	}
}

func TestBuildFixturesConcurrentAndCached(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = BuildFixtures(dir)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fx := fixturesIn(dir)
	before := make([]os.FileInfo, 0, len(fx.all()))
	for _, p := range fx.all() {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, fi)
	}
	if _, err := BuildFixtures(dir); err != nil {
		t.Fatal(err)
	}
	// Up to date: no file may be replaced, or attached uprobes would go stale.
	for i, p := range fx.all() {
		if fi, err := os.Stat(p); err != nil || !os.SameFile(before[i], fi) {
			t.Errorf("%s was rebuilt though up to date (err %v)", p, err)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".build-*")); len(leftovers) > 0 {
		t.Errorf("temporary build dirs left: %v", leftovers)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, stubSrc)); err != nil {
		t.Error(err)
	}
}

// params mirrors the workload's arguments, to predict exact call counts.
type params struct {
	threads, iters, launches, memcpys, mallocs, graphs, streams int
	driver                                                      int  // --driver N
	extra                                                       bool // --extra
	ptsz                                                        bool // --ptsz
}

func (p params) args() []string {
	a := strings.Fields(fmt.Sprintf("--threads %d --iters %d --launches %d --memcpy %d --mallocs %d --graphs %d --streams %d",
		p.threads, p.iters, p.launches, p.memcpys, p.mallocs, p.graphs, p.streams))
	if p.driver > 0 {
		a = append(a, "--driver", strconv.Itoa(p.driver))
	}
	if p.extra {
		a = append(a, "--extra")
	}
	if p.ptsz {
		a = append(a, "--ptsz")
	}
	return a
}

// small keeps launches > streams so every stream is used in each iteration.
var small = params{threads: 3, iters: 25, launches: 7, memcpys: 2, mallocs: 2, graphs: 2, streams: 3}

// smallAll adds every new API; driver > 3 so each driver API runs per iteration.
var smallAll = func() params { p := small; p.driver, p.extra = 5, true; return p }()

// smallPtsz and smallAllPtsz add the per-thread stream variants.
var (
	smallPtsz    = func() params { p := small; p.ptsz = true; return p }()
	smallAllPtsz = func() params { p := smallAll; p.ptsz = true; return p }()
)

// defaults are the workload's own defaults (flags absent).
var defaults = params{threads: 2, iters: 200, launches: 20, memcpys: 2, mallocs: 1, graphs: 1, streams: 2}

// wantCalls predicts the calls of one phase from the workload's documented
// structure; the workload itself counts what happened, so the two are
// independent.
func wantCalls(p params, errors, graphs bool) map[string]uint64 {
	T, I := uint64(p.threads), uint64(p.iters)
	perIter := func(n int) uint64 { return T * I * uint64(n) }
	c := map[string]uint64{
		"cudaMalloc":       T + perIter(p.mallocs), // + resident weights
		"cudaFree":         T + perIter(p.mallocs), // + cudaFree(NULL)
		"cudaMemcpy":       perIter(5 * p.memcpys),
		"cudaMemcpyAsync":  perIter(5 * p.memcpys),
		"cudaLaunchKernel": perIter(p.launches),
		"cudaMallocAsync":  T + perIter(p.mallocs), // + resident KV cache
		"cudaFreeAsync":    perIter(p.mallocs),
	}
	if graphs {
		c["cudaGraphLaunch"] = perIter(p.graphs)
		c["cudaGraphInstantiate"] = T
	}
	if errors {
		errIters := T * uint64((p.iters+9)/10) // iterations 0, 10, 20, ...
		for _, fn := range []string{"cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync",
			"cudaLaunchKernel", "cudaMallocAsync", "cudaFreeAsync"} {
			c[fn] += errIters
		}
		if graphs {
			c["cudaGraphLaunch"] += errIters
		}
	}
	if p.ptsz {
		// Each variant once per iteration; the failing calls like their
		// base functions'.
		for _, fn := range PtszFuncs {
			if graphs || !contains(graphFuncs, fn) {
				c[fn] = perIter(1)
			}
		}
		// cudaFreeAsync_ptsz frees cudaMallocFromPoolAsync_ptsz's allocation too.
		c["cudaFreeAsync_ptsz"] = perIter(2)
		if errors {
			errIters := T * uint64((p.iters+9)/10)
			c["cudaMemcpy_ptds"] += errIters
			if graphs {
				c["cudaGraphLaunch_ptsz"] += errIters
			}
		}
	}
	return c
}

func wantErrors(p params, graphs bool) map[string]map[string]uint64 {
	n := uint64(p.threads * ((p.iters + 9) / 10))
	e := map[string]map[string]uint64{
		"cudaMalloc": {"2": n}, "cudaMallocAsync": {"2": n},
		"cudaMemcpy": {"21": n}, "cudaMemcpyAsync": {"21": n},
		"cudaFree": {"1": n}, "cudaFreeAsync": {"1": n},
		"cudaLaunchKernel": {"98": n},
	}
	if graphs {
		e["cudaGraphLaunch"] = map[string]uint64{"400": n}
	}
	if p.ptsz {
		e["cudaMemcpy_ptds"] = map[string]uint64{"21": n}
		if graphs {
			e["cudaGraphLaunch_ptsz"] = map[string]uint64{"400": n}
		}
	}
	return e
}

func checkPhase(t *testing.T, gt *GroundTruth, p params, phases uint64, errors, graphs bool) {
	t.Helper()
	for _, fn := range ProbedFuncs {
		if want := phases * wantCalls(p, errors, graphs)[fn]; gt.Calls[fn] != want {
			t.Errorf("calls[%s] = %d, want %d", fn, gt.Calls[fn], want)
		}
	}
	if !errors && len(gt.Errors) != 0 {
		t.Errorf("errors with --no-errors: %v", gt.Errors)
	}
	if errors {
		want := wantErrors(p, graphs)
		if len(gt.Errors) != len(want) {
			t.Errorf("errors %v, want %v (per phase)", gt.Errors, want)
		}
		for fn, codes := range want {
			for code, n := range codes {
				if gt.Errors[fn][code] != phases*n || len(gt.Errors[fn]) != 1 {
					t.Errorf("errors[%s] = %v, want {%s: %d}", fn, gt.Errors[fn], code, phases*n)
				}
			}
		}
	}
	// Weights (64 MiB) and KV cache (8 MiB) stay allocated per thread.
	if want := phases * uint64(p.threads) * (72 << 20); gt.ActiveBytes != want {
		t.Errorf("active_bytes = %d, want %d", gt.ActiveBytes, want)
	}
	for _, k := range MemcpyKinds {
		if want := phases * 2 * uint64(p.threads*p.iters*p.memcpys); gt.MemcpyCalls[k] != want || gt.MemcpyBytes[k] == 0 {
			t.Errorf("memcpy_calls[%s] = %d (bytes %d), want %d calls", k, gt.MemcpyCalls[k], gt.MemcpyBytes[k], want)
		}
	}
	// Each thread's own streams plus the shared default stream, per phase.
	if want := int(phases)*p.threads*p.streams + 1; len(gt.CallsByStream["cudaLaunchKernel"]) != want {
		t.Errorf("launch streams %v, want %d keys", gt.CallsByStream["cudaLaunchKernel"], want)
	}
	if gt.CallsByStream["cudaLaunchKernel"]["default"] == 0 {
		t.Error("no launches on the default stream")
	}
}

func start(t *testing.T, bin string, args []string, opts ...Option) *Workload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	w, err := StartWorkload(ctx, bin, args, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return w
}

func TestWorkloadLinked(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, small.args())
	first, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, first, small, 1, true, true)

	// A second phase repeats the first exactly; totals are cumulative.
	second, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, second, small, 2, true, true)
	for _, pair := range [][2]uint64{
		{first.MallocBytes, second.MallocBytes}, {first.FreeBytes, second.FreeBytes},
		{first.LaunchGridBlocks, second.LaunchGridBlocks}, {first.LaunchBlockThreads, second.LaunchBlockThreads},
		{first.LaunchSharedBytes, second.LaunchSharedBytes}, {first.TotalCalls(), second.TotalCalls()},
	} {
		if pair[1] != 2*pair[0] {
			t.Errorf("second phase total %d, want twice %d", pair[1], pair[0])
		}
	}
	for _, k := range MemcpyKinds {
		if second.MemcpyBytes[k] != 2*first.MemcpyBytes[k] {
			t.Errorf("memcpy_bytes[%s]: %d then %d", k, first.MemcpyBytes[k], second.MemcpyBytes[k])
		}
	}
	if first.PID != w.PID || w.PID != w.Cmd.Process.Pid {
		t.Errorf("pid %d, ready pid %d, process %d", first.PID, w.PID, w.Cmd.Process.Pid)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestWorkloadDlopenNoErrors(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.WorkloadDlopen, append(small.args(), "--no-errors", "--lib", fx.Cudart))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, gt, small, 1, false, true)
	if gt.MemcpyCalls["unknown"] != 0 {
		t.Errorf("memcpy_calls[unknown] = %d with --no-errors", gt.MemcpyCalls["unknown"])
	}
}

func TestWorkloadDlopenMissingGraph(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.WorkloadDlopen, append(small.args(), "--lib", fx.CudartMissing))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPhase(t, gt, small, 1, true, false)
	if !strings.Contains(w.Stderr(), "no graph symbols") {
		t.Errorf("stderr %q does not report the missing graph symbols", w.Stderr())
	}
}

func TestWorkloadDlopenNotELF(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.WorkloadDlopen, []string{"--lib", fx.CudartNotELF})
	err := w.Load()
	if err == nil || !strings.Contains(err.Error(), "dlopen") {
		t.Fatalf("Load of a non-ELF library: %v, want a dlopen error", err)
	}
	if err := w.Stop(); err == nil {
		t.Error("Stop after a failed load reports no error")
	}
}

// Behind a wrapper that forks, the PID must be the workload's own.
func TestWorkloadWrapper(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, []string{"--threads", "1", "--iters", "3"},
		WithWrapper("sh", "-c", `"$@"; exit $?`, "sh"), WithDir(t.TempDir()))
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	if w.PID == w.Cmd.Process.Pid || gt.PID != w.PID {
		t.Errorf("ready pid %d, ground truth pid %d, wrapper pid %d", w.PID, gt.PID, w.Cmd.Process.Pid)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStartWorkloadFailures(t *testing.T) {
	fx := fixtures(t)
	ctx := context.Background()
	if _, err := StartWorkload(ctx, fx.Workload, []string{"--bogus"}); err == nil ||
		!strings.Contains(err.Error(), "bad argument --bogus") {
		t.Errorf("bad argument: %v, want the workload's stderr", err)
	}
	if _, err := StartWorkload(ctx, filepath.Join(fx.Dir, "nonexistent"), nil); err == nil {
		t.Error("nonexistent binary started")
	}
	begin := time.Now()
	if _, err := StartWorkload(ctx, "sleep", []string{"60"}, WithReadyTimeout(200*time.Millisecond)); err == nil ||
		!strings.Contains(err.Error(), "timed out") {
		t.Errorf("silent process: %v, want a timeout", err)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Errorf("timeout took %v: process not killed promptly", d)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Check must catch each kind of inconsistency it claims to.
func TestGroundTruthCheck(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, smallAllPtsz.args())
	good, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	clone := func() *GroundTruth {
		b, err := json.Marshal(good)
		if err != nil {
			t.Fatal(err)
		}
		var g GroundTruth
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		return &g
	}
	geometry := func(api string, f func(*LaunchGeometry)) func(g *GroundTruth) {
		return func(g *GroundTruth) {
			geo := g.LaunchGeometryByAPI[api]
			f(&geo)
			g.LaunchGeometryByAPI[api] = geo
		}
	}
	for name, mutate := range map[string]func(g *GroundTruth){
		"launches":        func(g *GroundTruth) { g.Launches++ },
		"stream sum":      func(g *GroundTruth) { g.CallsByStream["cudaMemcpyAsync"]["default"]++ },
		"stream key":      func(g *GroundTruth) { g.CallsByStream["cudaGraphLaunch"]["0x0"] = 0 },
		"stream function": func(g *GroundTruth) { g.CallsByStream["cudaMalloc"] = map[string]uint64{} },
		"new stream sum":  func(g *GroundTruth) { g.CallsByStream["cuLaunchKernelEx"]["default"]++ },
		"active":          func(g *GroundTruth) { g.ActiveBytes++ },
		"memcpy calls":    func(g *GroundTruth) { g.MemcpyCalls["h2d"]++ },
		"memcpy unknown":  func(g *GroundTruth) { g.Errors["cudaMemcpy"]["21"]++ },
		"memcpy 2d error": func(g *GroundTruth) { g.Errors["cudaMemcpy2D"] = map[string]uint64{"21": 1} },
		"memcpy p2p":      func(g *GroundTruth) { g.MemcpyCalls[MemcpyPeer]++; g.MemcpyCalls["h2d"]-- },
		"memcpy kind":     func(g *GroundTruth) { g.MemcpyBytes["p3p"] = 1 },
		"error code":      func(g *GroundTruth) { g.Errors["cudaFree"]["0"] = 1 },
		"function":        func(g *GroundTruth) { g.Calls["cudaBogus"] = 1 },
		"launch api":      func(g *GroundTruth) { g.LaunchesByAPI["cuLaunchKernelEx"]++ },
		"launch api name": func(g *GroundTruth) { g.LaunchesByAPI["cuBogus"] = 0 },
		"kernel sum":      func(g *GroundTruth) { g.LaunchesByKernel[RuntimeKernels[0]]++ },
		"kernel name":     func(g *GroundTruth) { g.LaunchesByKernel["bogus"] = 0 },
		"null kernel": func(g *GroundTruth) {
			g.LaunchesByKernel[""]++
			g.LaunchesByKernel[DriverKernels[0]]--
		},
		"geometry":           geometry("cudaLaunchKernel", func(l *LaunchGeometry) { l.SharedBytes++ }),
		"geometry blocks":    geometry("cuLaunchKernelEx", func(l *LaunchGeometry) { l.GridBlocks = 0 }),
		"geometry api":       func(g *GroundTruth) { g.LaunchGeometryByAPI["cuBogus"] = LaunchGeometry{} },
		"memset key":         func(g *GroundTruth) { g.MemsetBytes["0x0"] = 1 },
		"managed":            func(g *GroundTruth) { g.ManagedBytes = g.MallocBytes + 1 },
		"set device":         func(g *GroundTruth) { g.SetDeviceCalls++ },
		"ptsz launch api":    func(g *GroundTruth) { g.LaunchesByAPI["cudaLaunchKernelExC_ptsz"]++ },
		"ptsz stream sum":    func(g *GroundTruth) { g.CallsByStream["cudaFreeAsync_ptsz"]["0x1"]++ },
		"ptds stream":        func(g *GroundTruth) { g.CallsByStream["cudaMemcpy_ptds"] = map[string]uint64{} },
		"ptds memcpy calls":  func(g *GroundTruth) { g.Calls["cudaMemcpy2D_ptds"]++ },
		"ptds memcpy error":  func(g *GroundTruth) { g.Errors["cudaMemcpy2D_ptds"] = map[string]uint64{"21": 1} },
		"ptsz listed":        func(g *GroundTruth) { delete(g.Calls, "cudaMemset_ptds") },
		"ptsz geometry":      geometry("cudaLaunchCooperativeKernel_ptsz", func(l *LaunchGeometry) { l.GridBlocks = 0 }),
		"ptsz failed launch": func(g *GroundTruth) { g.Errors["cudaLaunchKernelExC_ptsz"] = map[string]uint64{"98": 1} },
	} {
		g := clone()
		mutate(g)
		if err := g.Check(); err == nil {
			t.Errorf("%s: inconsistency not caught", name)
		}
	}
	if err := clone().Check(); err != nil {
		t.Errorf("clone of valid ground truth: %v", err)
	}
	// Without the new APIs nothing of them may show.
	g := clone()
	g.MemsetBytes = map[string]uint64{"default": 1}
	for _, fn := range memsetFuncs {
		g.Calls[fn] = 0
		delete(g.CallsByStream, fn)
	}
	if err := g.Check(); err == nil {
		t.Error("memset bytes without memset calls: not caught")
	}
}

// checkCumulative checks the workload's own ground truth across phases:
// every phase does the same, so the cumulative totals after phase n are n
// times the first phase's (Run has checked each for consistency). It
// returns the first phase's ground truth.
func checkCumulative(t *testing.T, first, gt *GroundTruth, phase uint64) *GroundTruth {
	t.Helper()
	if first == nil {
		return gt
	}
	for _, m := range []struct {
		name        string
		first, here map[string]uint64
	}{{"calls", first.Calls, gt.Calls}, {"memcpy_calls", first.MemcpyCalls, gt.MemcpyCalls}, {"memcpy_bytes", first.MemcpyBytes, gt.MemcpyBytes},
		{"launches_by_api", first.LaunchesByAPI, gt.LaunchesByAPI}, {"launches_by_kernel", first.LaunchesByKernel, gt.LaunchesByKernel}} {
		for k, n := range m.first {
			if m.here[k] != phase*n {
				t.Errorf("%s[%s] after phase %d = %d, want %d x %d", m.name, k, phase, m.here[k], phase, n)
			}
		}
		if len(m.here) != len(m.first) {
			t.Errorf("%s keys after phase %d: %v, first phase %v", m.name, phase, m.here, m.first)
		}
	}
	return first
}

// checkClosedForm checks a few --driver/--extra totals by formula, apart
// from the simulation (errors on, graphs present).
func checkClosedForm(t *testing.T, gt *GroundTruth, p params, phases uint64) {
	t.Helper()
	T, I := phases*uint64(p.threads), uint64(p.iters)
	errIters := T * uint64((p.iters+9)/10)
	var drv uint64
	for _, api := range []string{"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"} {
		drv += gt.LaunchesByAPI[api]
	}
	if want := T*I*uint64(p.driver) + errIters; drv != want {
		t.Errorf("driver launches %d, want %d", drv, want)
	}
	for _, fn := range ExtraFuncs {
		want := T * I
		if fn == "cudaSetDevice" {
			want += errIters
		}
		if gt.Calls[fn] != want {
			t.Errorf("calls[%s] = %d, want %d", fn, gt.Calls[fn], want)
		}
	}
	// NULL free + per-iteration frees + managed, pitched, 3D and pool frees + bogus frees.
	if want := T*(1+uint64(p.mallocs)*I+4*I) + errIters; gt.Calls["cudaFree"] != want {
		t.Errorf("calls[cudaFree] = %d, want %d", gt.Calls["cudaFree"], want)
	}
	if gt.Calls["cuModuleGetFunction"] != 2*T || gt.Calls["cuInit"] != T {
		t.Errorf("driver setup calls %v", gt.Calls)
	}
	if n := gt.LaunchesByKernel[DriverKernels[2]]; n == 0 || n >= gt.LaunchesByAPI["cuLaunchKernel"] {
		t.Errorf("paged attention launches %d, cuLaunchKernel %d", n, gt.LaunchesByAPI["cuLaunchKernel"])
	}
	// Peer copies: cudaMemcpyPeer[Async] and cudaMemcpy3DPeer[Async] per
	// --extra iteration, the two per-thread 3D peer variants per --ptsz one.
	peers := 4 * T * I
	if p.ptsz {
		peers += 2 * T * I
	}
	if gt.ActiveBytes != T*(72<<20) || gt.MemcpyCalls[MemcpyPeer] != peers {
		t.Errorf("active_bytes %d, memcpy_calls[p2p] %d", gt.ActiveBytes, gt.MemcpyCalls[MemcpyPeer])
	}
}

// The new APIs, through both builds: exact counts over two phases.
func TestWorkloadDriverExtra(t *testing.T) {
	fx := fixtures(t)
	for _, tc := range []struct {
		name string
		bin  string
		args []string
	}{
		{"linked", fx.Workload, nil},
		{"dlopen", fx.WorkloadDlopen, []string{"--lib", fx.Cudart}}, // driver next to it
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := start(t, tc.bin, append(smallAll.args(), tc.args...))
			if err := w.Load(); err != nil {
				t.Fatal(err)
			}
			var first *GroundTruth
			for phase := 1; phase <= 2; phase++ {
				gt, err := w.Run()
				if err != nil {
					t.Fatal(err)
				}
				first = checkCumulative(t, first, gt, uint64(phase))
				checkClosedForm(t, gt, smallAll, uint64(phase))
			}
			if err := w.Stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestWorkloadDlopenDriverMissingGraph(t *testing.T) {
	fx := fixtures(t)
	p := smallAll
	p.iters = 13
	w := start(t, fx.WorkloadDlopen, append(p.args(), "--no-errors", "--lib", fx.CudartMissing, "--lib-cuda", fx.Cuda))
	if err := w.Load(); err != nil {
		t.Fatal(err)
	}
	gt, err := w.Run()
	if err != nil {
		t.Fatal(err)
	}
	// A runtime without graph symbols: the workload makes no graph call,
	// and --no-errors makes no failing one.
	if n := gt.Calls["cudaGraphLaunch"] + gt.Calls["cudaGraphInstantiate"]; n != 0 || len(gt.Errors) != 0 {
		t.Errorf("graph calls %d, errors %v; want none", n, gt.Errors)
	}

	// Without --lib-cuda the driver is looked for next to the runtime.
	w = start(t, fx.WorkloadDlopen, []string{"--driver", "1", "--lib", fx.CudartMissing})
	if err := w.Load(); err == nil || !strings.Contains(err.Error(), filepath.Join(filepath.Dir(fx.CudartMissing), "libcuda.so.1")) {
		t.Errorf("load without a driver next to the runtime: %v", err)
	}
}

// Default flags keep the default run exactly as it was; all new APIs on
// stay within the size the e2e tests budget for.
func TestWorkloadDefaultSize(t *testing.T) {
	fx := fixtures(t)
	gt, err := start(t, fx.Workload, nil).Run()
	if err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, n := range wantCalls(defaults, true, true) {
		want += n
	}
	if gt.TotalCalls() != want || want != 18328 {
		t.Errorf("default run: %d calls, predicted %d, want 18328", gt.TotalCalls(), want)
	}

	all := defaults
	all.driver, all.extra = 5, true
	gt, err = start(t, fx.Workload, []string{"--driver", "5", "--extra"}).Run()
	if err != nil {
		t.Fatal(err)
	}
	if gt.TotalCalls() > 40000 {
		t.Errorf("--driver 5 --extra: %d calls, want at most 40000", gt.TotalCalls())
	}
}

// bindingsEnv is the environment with lazy binding reported on stderr.
func bindingsEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_BIND_NOW=") && !strings.HasPrefix(kv, "LD_DEBUG") {
			env = append(env, kv)
		}
	}
	return append(env, "LD_DEBUG=bindings")
}

// The runtime must reach the driver through the driver's exported symbols
// (PLT), where driver uprobes fire. glibc's LD_DEBUG=bindings shows each
// lazily bound symbol at its first call.
func TestRuntimeCallsDriver(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, []string{"--threads", "1", "--iters", "1", "--launches", "1", "--extra"},
		WithEnv(bindingsEnv()))
	if _, err := w.Run(); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	stderr := w.Stderr()
	if !strings.Contains(stderr, "binding file") {
		t.Skip("dynamic loader does not report bindings (not glibc?)")
	}
	for _, sym := range runtimeImports {
		line := fmt.Sprintf("binding file %s [0] to %s [0]: normal symbol `%s'", fx.Cudart, fx.Cuda, sym)
		if !strings.Contains(stderr, line) {
			t.Errorf("no %q in the loader's bindings", line)
		}
	}
}

// Each per-thread stream variant is its base function's name plus _ptsz
// when the base takes a stream, else _ptds, and every table treats the two
// alike.
func TestPtszTables(t *testing.T) {
	if len(PtszBase) != len(PtszFuncs) {
		t.Errorf("PtszBase has %d entries, PtszFuncs %d", len(PtszBase), len(PtszFuncs))
	}
	seen := map[string]bool{}
	for _, fn := range AllFuncs {
		if seen[fn] {
			t.Errorf("AllFuncs lists %s twice", fn)
		}
		seen[fn] = true
	}
	for _, fn := range PtszFuncs {
		base, ok := PtszBase[fn]
		if !ok || !contains(slices.Concat(ProbedFuncs, ExtraFuncs), base) {
			t.Errorf("%s: base %q is no default or --extra function", fn, base)
			continue
		}
		stream := contains(AllStreamFuncs, base)
		if suffix := map[bool]string{true: "_ptsz", false: "_ptds"}[stream]; fn != base+suffix {
			t.Errorf("%s: want %s%s (base takes a stream: %v)", fn, base, suffix, stream)
		}
		for name, list := range map[string][]string{
			"AllStreamFuncs": AllStreamFuncs, "LaunchAPIs": LaunchAPIs, "memcpyFuncs": memcpyFuncs,
			"memsetFuncs": memsetFuncs, "graphFuncs": graphFuncs,
		} {
			if contains(list, fn) != contains(list, base) {
				t.Errorf("%s in %s: %v, its base %s: %v", fn, name, contains(list, fn), base, contains(list, base))
			}
		}
	}
}

// checkPtsz checks the per-thread stream variants' totals by formula, apart
// from the simulation.
func checkPtsz(t *testing.T, gt *GroundTruth, p params, phases uint64, errors, graphs bool) {
	t.Helper()
	want := wantCalls(p, errors, graphs)
	fns := PtszFuncs
	if !p.extra { // --extra adds managed frees to cudaFree: see checkClosedForm
		fns = slices.Concat(ProbedFuncs, PtszFuncs)
	}
	for _, fn := range fns {
		if gt.Calls[fn] != phases*want[fn] {
			t.Errorf("calls[%s] = %d, want %d", fn, gt.Calls[fn], phases*want[fn])
		}
	}
	for fn, codes := range wantErrors(p, graphs) {
		if !contains(PtszFuncs, fn) {
			continue
		}
		for code, n := range codes {
			if gt.Errors[fn][code] != phases*n || len(gt.Errors[fn]) != 1 {
				t.Errorf("errors[%s] = %v, want {%s: %d}", fn, gt.Errors[fn], code, phases*n)
			}
		}
	}
	TI := phases * uint64(p.threads*p.iters)
	for _, api := range []string{"cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel_ptsz"} {
		if gt.LaunchesByAPI[api] != TI || len(gt.Errors[api]) != 0 {
			t.Errorf("launches_by_api[%s] = %d (errors %v), want %d", api, gt.LaunchesByAPI[api], gt.Errors[api], TI)
		}
	}
	// Every asynchronous allocation is freed: only the resident buffers stay.
	if want := phases * uint64(p.threads) * (72 << 20); gt.ActiveBytes != want {
		t.Errorf("active_bytes = %d, want %d", gt.ActiveBytes, want)
	}
}

// The per-thread default stream variants, alone and with every other API,
// through both builds: exact counts over two phases.
func TestWorkloadPtsz(t *testing.T) {
	fx := fixtures(t)
	for _, pc := range []struct {
		name string
		p    params
	}{{"ptsz", smallPtsz}, {"all", smallAllPtsz}} {
		for _, bc := range []struct {
			name string
			bin  string
			args []string
		}{
			{"linked", fx.Workload, nil},
			{"dlopen", fx.WorkloadDlopen, []string{"--lib", fx.Cudart}},
		} {
			t.Run(pc.name+"/"+bc.name, func(t *testing.T) {
				w := start(t, bc.bin, append(pc.p.args(), bc.args...))
				if err := w.Load(); err != nil {
					t.Fatal(err)
				}
				var first *GroundTruth
				for phase := 1; phase <= 2; phase++ {
					gt, err := w.Run()
					if err != nil {
						t.Fatal(err)
					}
					first = checkCumulative(t, first, gt, uint64(phase))
					checkPtsz(t, gt, pc.p, uint64(phase), true, true)
					if pc.p.extra {
						checkClosedForm(t, gt, pc.p, uint64(phase))
					}
				}
				if err := w.Stop(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// Without graph symbols cudaGraphLaunch_ptsz is skipped like cudaGraphLaunch.
func TestWorkloadDlopenPtszMissingGraph(t *testing.T) {
	fx := fixtures(t)
	for _, p := range []params{smallPtsz, smallAllPtsz} {
		w := start(t, fx.WorkloadDlopen, append(p.args(), "--lib", fx.CudartMissing, "--lib-cuda", fx.Cuda))
		if err := w.Load(); err != nil {
			t.Fatal(err)
		}
		gt, err := w.Run()
		if err != nil {
			t.Fatal(err)
		}
		checkPtsz(t, gt, p, 1, true, false)
		if n, ok := gt.Calls["cudaGraphLaunch_ptsz"]; !ok || n != 0 {
			t.Errorf("calls[cudaGraphLaunch_ptsz] = %d (listed %v), want 0, listed", n, ok)
		}
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// --ptsz adds its calls to the default run and changes nothing else; with
// every API on the run stays within the e2e tests' budget.
func TestWorkloadDefaultSizePtsz(t *testing.T) {
	fx := fixtures(t)
	p := defaults
	p.ptsz = true
	gt, err := start(t, fx.Workload, []string{"--ptsz"}).Run()
	if err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, n := range wantCalls(p, true, true) {
		want += n
	}
	// 24 variants and a second cudaFreeAsync_ptsz per iteration and thread,
	// 2 failing calls every 10th.
	if gt.TotalCalls() != want || want != 18328+2*200*25+2*20*2 {
		t.Errorf("--ptsz: %d calls, predicted %d, want %d", gt.TotalCalls(), want, 18328+2*200*25+2*20*2)
	}
	checkPtsz(t, gt, p, 1, true, true)

	p.driver, p.extra = 5, true
	gt, err = start(t, fx.Workload, []string{"--driver", "5", "--extra", "--ptsz"}).Run()
	if err != nil {
		t.Fatal(err)
	}
	checkPtsz(t, gt, p, 1, true, true)
	checkClosedForm(t, gt, p, 1)
	if gt.TotalCalls() > 50000 {
		t.Errorf("--driver 5 --extra --ptsz: %d calls, want at most 50000", gt.TotalCalls())
	}
}

// The variants' launches reach the driver through its exported symbols like
// their base functions: with no other launch in the run, the loader binds
// exactly the driver launch functions they call.
func TestRuntimePtszCallsDriver(t *testing.T) {
	fx := fixtures(t)
	w := start(t, fx.Workload, []string{"--threads", "1", "--iters", "1", "--launches", "0",
		"--graphs", "0", "--no-errors", "--ptsz"}, WithEnv(bindingsEnv()))
	if _, err := w.Run(); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	stderr := w.Stderr()
	if !strings.Contains(stderr, "binding file") {
		t.Skip("dynamic loader does not report bindings (not glibc?)")
	}
	for sym, want := range map[string]bool{
		"cuLaunchKernelEx":          true, // cudaLaunchKernelExC_ptsz
		"cuLaunchCooperativeKernel": true, // cudaLaunchCooperativeKernel_ptsz
		"cuGraphLaunch":             true, // cudaGraphLaunch_ptsz
		"cuLaunchKernel":            false,
		"cuLaunchKernel_ptsz":       false,
	} {
		line := fmt.Sprintf("binding file %s [0] to %s [0]: normal symbol `%s'", fx.Cudart, fx.Cuda, sym)
		if got := strings.Contains(stderr, line); got != want {
			t.Errorf("%q in the loader's bindings: %v, want %v", line, got, want)
		}
	}
}

// definedFuncs returns every function path defines in .dynsym, whatever
// its binding.
func definedFuncs(t *testing.T, path string) map[string]elf.Symbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]elf.Symbol{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			out[s.Name] = s
		}
	}
	return out
}

// checkPushRBP checks that each named symbol starts with push %rbp.
func checkPushRBP(t *testing.T, lib string, syms map[string]elf.Symbol, names []string) {
	t.Helper()
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	data, err := text.Data()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		off := syms[name].Value - text.Addr
		if off >= uint64(len(data)) || data[off] != 0x55 {
			t.Errorf("%s: %s does not start with push %%rbp (0x55)", lib, name)
		}
	}
}

// ncclControls are the stub-private functions of the NCCL stub.
var ncclControls = []string{"profi_stub_nccl_set_delay_ns", "profi_stub_nccl_block_next", "profi_stub_nccl_set_device"}

// nvtxExports are all functions the NVTX stub exports.
var nvtxExports = slices.Concat(NVTXFuncs, []string{
	"nvtxInitialize", "nvtxMarkA", "nvtxRangePushEx", "nvtxDomainDestroy", "nvtxDomainRegisterStringA",
})

// As NVIDIA builds libnccl (PROFAPI): every API name weak, its pnccl*
// profiling name global at the same address; one address per API function.
func TestNCCLStubELF(t *testing.T) {
	fx := fixtures(t)
	if got := dynStrings(t, fx.Nccl, elf.DT_SONAME); len(got) != 1 || got[0] != "libnccl.so.2" {
		t.Errorf("%s: SONAME %q, want libnccl.so.2", fx.Nccl, got)
	}
	syms := definedFuncs(t, fx.Nccl)
	addrs := map[uint64]string{}
	var api []string
	for name := range syms {
		if strings.HasPrefix(name, "nccl") {
			api = append(api, name)
		}
	}
	if slices.Sort(api); !slices.Equal(api, slices.Sorted(slices.Values(NCCLFuncs))) {
		t.Errorf("%s exports %q, want %q", fx.Nccl, api, slices.Sorted(slices.Values(NCCLFuncs)))
	}
	for _, name := range NCCLFuncs {
		s, p := syms[name], syms["p"+name]
		if elf.ST_BIND(s.Info) != elf.STB_WEAK || elf.ST_BIND(p.Info) != elf.STB_GLOBAL || s.Value != p.Value || s.Value == 0 {
			t.Errorf("%s: %s %v at %#x, p%s %v at %#x; want weak and global at one address",
				fx.Nccl, name, elf.ST_BIND(s.Info), s.Value, name, elf.ST_BIND(p.Info), p.Value)
		}
		if other, dup := addrs[s.Value]; dup {
			t.Errorf("%s: %s and %s share address %#x", fx.Nccl, name, other, s.Value)
		}
		addrs[s.Value] = name
	}
	for _, name := range ncclControls {
		if s, ok := syms[name]; !ok || elf.ST_BIND(s.Info) != elf.STB_GLOBAL {
			t.Errorf("%s does not export %s", fx.Nccl, name)
		}
	}
	checkPushRBP(t, fx.Nccl, syms, NCCLFuncs)
}

func TestNVTXStubELF(t *testing.T) {
	fx := fixtures(t)
	for lib, soname := range map[string]string{fx.Nvtx: "libnvToolsExt.so.1", fx.Nvtx3Interop: "libnvtx3interop.so.1"} {
		if got := dynStrings(t, lib, elf.DT_SONAME); len(got) != 1 || got[0] != soname {
			t.Errorf("%s: SONAME %q, want %s", lib, got, soname)
		}
		syms := definedFuncs(t, lib)
		addrs := map[uint64]string{}
		for _, name := range nvtxExports {
			s, ok := syms[name]
			if !ok || elf.ST_BIND(s.Info) != elf.STB_GLOBAL {
				t.Errorf("%s does not export %s", lib, name)
				continue
			}
			if other, dup := addrs[s.Value]; dup {
				t.Errorf("%s: %s and %s share address %#x", lib, name, other, s.Value)
			}
			addrs[s.Value] = name
		}
		checkPushRBP(t, lib, syms, nvtxExports)
	}
}

func TestNCCLWorkloadELF(t *testing.T) {
	fx := fixtures(t)
	needed := dynStrings(t, fx.NcclWorkload, elf.DT_NEEDED)
	for _, lib := range []string{"libnccl.so.2", "libcudart.so.12"} {
		if !contains(needed, lib) {
			t.Errorf("NCCL workload NEEDED %q lacks %s", needed, lib)
		}
	}
	if runpath := dynStrings(t, fx.NcclWorkload, elf.DT_RUNPATH); !contains(runpath, fx.Dir) {
		t.Errorf("NCCL workload RUNPATH %q, want %s", runpath, fx.Dir)
	}
	// NVTX is opened only with --nvtx, never linked.
	for _, bin := range []string{fx.Workload, fx.WorkloadDlopen, fx.NcclWorkload} {
		for _, lib := range dynStrings(t, bin, elf.DT_NEEDED) {
			if strings.Contains(lib, "nvToolsExt") || strings.Contains(lib, "nvtx") {
				t.Errorf("%s links %s", bin, lib)
			}
		}
	}
}

// startNCCL starts one rank, stopped at cleanup.
func startNCCL(t *testing.T, args []string) *NCCLWorkload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	w, err := StartNCCL(ctx, fixtures(t).NcclWorkload, args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return w
}

// ncclWant is the predicted ground truth of the NCCL workload.
type ncclWant struct {
	calls       map[string]uint64
	errors      map[string]map[string]uint64
	dts         map[string]map[string]NCCLTally
	collectives uint64 // on the job's communicator
}

func (w *ncclWant) data(fn string, dt int, count uint64, code int) {
	w.calls[fn]++
	if w.dts[fn] == nil {
		w.dts[fn] = map[string]NCCLTally{}
	}
	var size uint64
	if dt >= 0 && dt < len(NCCLDatatypeSizes) {
		size = NCCLDatatypeSizes[dt]
	}
	r := w.dts[fn][strconv.Itoa(dt)]
	r.Calls++
	r.Elements += count
	r.Bytes += count * size
	if code != 0 {
		r.ErrorCalls++
		r.ErrorBytes += count * size
		w.err(fn, code)
	}
	w.dts[fn][strconv.Itoa(dt)] = r
}

func (w *ncclWant) err(fn string, code int) {
	if w.errors[fn] == nil {
		w.errors[fn] = map[string]uint64{}
	}
	w.errors[fn][strconv.Itoa(code)]++
}

// wantNCCL predicts the blocking workload's calls over phases "go"s of
// iters steps (rank 0, which makes the unique id), from its documented
// structure; the workload counts what happened, so the two are independent.
func wantNCCL(iters, phases int) *ncclWant {
	w := &ncclWant{calls: map[string]uint64{}, errors: map[string]map[string]uint64{}, dts: map[string]map[string]NCCLTally{}}
	for _, fn := range NCCLFuncs {
		w.calls[fn] = 0
	}
	w.calls["ncclGetUniqueId"], w.calls["ncclCommInitRank"] = 1, 1
	for range phases {
		for _, fn := range []string{"ncclGetVersion", "ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice",
			"ncclCommGetAsyncError", "ncclGetErrorString"} {
			w.calls[fn]++
		}
		for i := range uint64(iters) {
			for d := range 12 {
				w.data("ncclAllReduce", d, 256*uint64(d+1)+8*(i%4), 0)
			}
			for _, d := range []int{7, 9, 10} {
				w.data("ncclAllGather", d, 512+64*(i%3), 0)
			}
			for _, d := range []int{7, 9, 6} {
				w.data("ncclReduceScatter", d, 1024+16*(i%5), 0)
			}
			w.data("ncclBroadcast", 0, 4096, 0)
			w.data("ncclBroadcast", 8, 4096, 0)
			w.data("ncclReduce", 4, 2048, 0)
			w.data("ncclReduce", 5, 2048, 0)
			w.data("ncclAlltoAll", 9, 128*(i%4+1), 0)
			w.data("ncclAlltoAll", 11, 128*(i%4+1), 0)
			for _, d := range []int{7, 9, 3} {
				w.data("ncclSend", d, 2048+uint64(d), 0)
				w.data("ncclRecv", d, 2048+uint64(d), 0)
			}
			w.data("ncclAllReduce", 9, 1<<20, 0)
			w.data("ncclAllGather", 11, 4096, 0)
			w.calls["ncclGroupStart"] += 3
			w.calls["ncclGroupEnd"] += 3
			// 12 all-reduces, 3 all-gathers, 3 reduce-scatters, 2
			// broadcasts, 2 reduces, 2 all-to-alls, the nested group's 2.
			w.collectives += 26
			if i%10 != 0 {
				continue
			}
			// The argument errors on the communicator (the all-gather's is
			// on none) and the 4 GiB broadcast.
			w.collectives += 4
			w.data("ncclAllReduce", 12, 4096, 4)
			w.data("ncclSend", -1, 1024, 4)
			w.data("ncclAllGather", 7, 256, 4)
			w.data("ncclBroadcast", 2, 64, 4)
			w.data("ncclRecv", 6, 64, 4)
			w.data("ncclAllReduce", 6, 512, 4)
			w.calls["ncclGroupEnd"]++
			w.err("ncclGroupEnd", 5)
			w.data("ncclBroadcast", 0, 1<<32+512, 0)
		}
	}
	return w
}

func checkNCCL(t *testing.T, got *NCCLGroundTruth, want *ncclWant) {
	t.Helper()
	if !reflect.DeepEqual(got.Calls, want.calls) {
		t.Errorf("calls\ngot  %v\nwant %v", got.Calls, want.calls)
	}
	if !reflect.DeepEqual(got.Errors, want.errors) {
		t.Errorf("errors\ngot  %v\nwant %v", got.Errors, want.errors)
	}
	if !reflect.DeepEqual(got.ByDatatype, want.dts) {
		t.Errorf("by_datatype\ngot  %v\nwant %v", got.ByDatatype, want.dts)
	}
	if got.Collectives != want.collectives {
		t.Errorf("collectives on the communicator: %d, want %d", got.Collectives, want.collectives)
	}
}

// A two-rank job: one unique id, one communicator hash, exact counts over
// two phases on each rank.
func TestNCCLWorkloadJob(t *testing.T) {
	fx := fixtures(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const iters = 23
	ranks, err := StartNCCLJob(ctx, fx.NcclWorkload, 2, func(int) []string { return []string{"--iters", strconv.Itoa(iters)} })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranks {
		t.Cleanup(func() { _ = r.Stop() })
	}
	var first *NCCLGroundTruth
	for rank, r := range ranks {
		for phase := 1; phase <= 2; phase++ {
			gt, err := r.Go()
			if err != nil {
				t.Fatal(err)
			}
			want := wantNCCL(iters, phase)
			if rank > 0 { // joined with rank 0's id
				want.calls["ncclGetUniqueId"] = 0
			}
			checkNCCL(t, gt, want)
			if gt.Rank != rank || gt.NRanks != 2 || gt.Device != rank || gt.Blocking != -1 || gt.CUDACalls["cudaSetDevice"] != 1 {
				t.Errorf("rank %d: identity %+v, cuda_calls %v", rank, gt.NCCLIdentity, gt.CUDACalls)
			}
			if first == nil {
				first = gt
			} else if gt.ID != first.ID || gt.CommHash != first.CommHash {
				t.Errorf("rank %d: id %s hash %s, rank 0: %s %s", rank, gt.ID, gt.CommHash, first.ID, first.CommHash)
			}
		}
	}
	// Every datatype value with its size, checked apart from the table.
	gt, err := ranks[0].Go()
	if err != nil {
		t.Fatal(err)
	}
	for dt, size := range map[string]uint64{"0": 1, "1": 1, "2": 4, "3": 4, "4": 8, "5": 8, "6": 2, "7": 4, "8": 8, "9": 2, "10": 1, "11": 1, "12": 0} {
		if r := gt.ByDatatype["ncclAllReduce"][dt]; r.Calls == 0 || r.Bytes != r.Elements*size {
			t.Errorf("ncclAllReduce datatype %s: %+v, want %d bytes per element", dt, r, size)
		}
	}
	if r := gt.ByDatatype["ncclBroadcast"]["0"]; r.Elements < 3*(1<<32) {
		t.Errorf("broadcast int8 elements %d: the 2^32+512 counts are missing", r.Elements)
	}
}

// Non-blocking: init returns 7 and is polled; outside groups every second
// valid data call returns 7, as does every outer group end.
func TestNCCLWorkloadNonBlocking(t *testing.T) {
	const iters = 12
	w := startNCCL(t, NCCLArgs(0, 2, "--iters", strconv.Itoa(iters), "--blocking", "0"))
	in, err := w.Init()
	if err != nil {
		t.Fatal(err)
	}
	if in.RC != NCCLInProgress || in.Blocking != 0 {
		t.Errorf("init %+v, want rc 7", in)
	}
	gt, err := w.Go()
	if err != nil {
		t.Fatal(err)
	}
	var inProgress uint64
	for _, fn := range NCCLDataFuncs {
		inProgress += gt.Errors[fn]["7"]
	}
	valid := uint64(24*iters + (iters+9)/10) // data calls outside groups passing the checks
	if inProgress != valid/2 || gt.Errors["ncclGroupEnd"]["7"] != 2*iters || gt.Errors["ncclCommInitRankConfig"]["7"] != 1 {
		t.Errorf("in progress: data %d (want %d), group end %v, init %v", inProgress, valid/2, gt.Errors["ncclGroupEnd"], gt.Errors["ncclCommInitRankConfig"])
	}
	if gt.Calls["ncclCommInitRankConfig"] != 1 || gt.Calls["ncclCommInitRank"] != 0 || gt.Calls["ncclCommGetAsyncError"] != 3 {
		t.Errorf("calls %v", gt.Calls)
	}
}

// hang, delay, initall, destroy, abort and a bad unique id.
func TestNCCLWorkloadCommands(t *testing.T) {
	w := startNCCL(t, NCCLArgs(0, 1, "--iters", "1"))
	if _, err := w.Init(); err != nil {
		t.Fatal(err)
	}
	h, err := w.Hang(30*time.Millisecond, "")
	if err != nil {
		t.Fatal(err)
	}
	if h.Op != "ncclAllReduce" || h.RC != 0 || h.NS < uint64(30*time.Millisecond) {
		t.Errorf("hang: %+v, want ncclAllReduce, 0, at least 30 ms", h)
	}
	if h, err = w.Hang(0, "ncclSend"); err != nil || h.Op != "ncclSend" || h.RC != 0 {
		t.Errorf("hang 0 ncclSend: %+v, %v", h, err)
	}
	if err := w.SetDelay(uint64(2 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if rc, err := w.InitAll(3); err != nil || rc != 0 {
		t.Errorf("initall 3: %d, %v", rc, err)
	}
	gt, err := w.Go()
	if err != nil {
		t.Fatal(err)
	}
	want := wantNCCL(1, 1)
	want.data("ncclAllReduce", 7, 1<<20, 0) // hang
	want.collectives++
	want.data("ncclSend", 7, 1<<20, 0)
	for range 3 { // initall
		want.data("ncclAllReduce", 7, 1024, 0)
	}
	want.calls["ncclCommInitAll"], want.calls["ncclCommDestroy"] = 1, 3
	want.calls["ncclGroupStart"]++
	want.calls["ncclGroupEnd"]++
	checkNCCL(t, gt, want)
	// 12 + 1 + 3 (initall) ncclAllReduce calls since the delay succeeded.
	ok := gt.Calls["ncclAllReduce"] - 1 - sumValues(gt.Errors["ncclAllReduce"])
	if gt.DelayNS != uint64(2*time.Millisecond) || gt.HostNS["ncclAllReduce"] < ok*uint64(2*time.Millisecond) {
		t.Errorf("delay %d: %d ncclAllReduce calls took %d ns in all", gt.DelayNS, ok, gt.HostNS["ncclAllReduce"])
	}

	if rc, err := w.Destroy(); err != nil || rc != 0 {
		t.Errorf("destroy: %d, %v", rc, err)
	}
	if rc, err := w.Abort(); err != nil || rc != NCCLInvalidArgument {
		t.Errorf("abort of a destroyed communicator: %d, %v; want 4", rc, err)
	}
	before := gt
	if gt, err = w.Go(); err != nil {
		t.Fatal(err)
	}
	for _, fn := range NCCLDataFuncs {
		if n := gt.Calls[fn] - before.Calls[fn]; n == 0 || gt.Errors[fn]["4"]-before.Errors[fn]["4"] != n {
			t.Errorf("%s on a destroyed communicator: %d calls, errors %v (before %v)", fn, n, gt.Errors[fn], before.Errors[fn])
		}
	}

	w = startNCCL(t, NCCLArgs(0, 2, "--id", strings.Repeat("00", 128)))
	if in, err := w.Init(); err == nil || in == nil || in.RC != NCCLInvalidArgument {
		t.Errorf("init with a zero id: %+v, %v; want rc 4", in, err)
	}
}

// A blocked call stays in flight until the process is killed.
func TestNCCLWorkloadBlock(t *testing.T) {
	w := startNCCL(t, NCCLArgs(0, 2))
	if _, err := w.Init(); err != nil {
		t.Fatal(err)
	}
	if err := w.Block("ncclRecv"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.exited:
		t.Fatalf("exited while blocked: %v", w.exitStatus())
	case <-time.After(200 * time.Millisecond):
	}
	w.Kill()
	if err := w.Stop(); err != nil {
		t.Errorf("stop after kill: %v", err)
	}
}

// --nvtx: the NVTX library is mapped only with the flag; every launch is
// counted under its phase, and nothing else changes.
func TestWorkloadNVTX(t *testing.T) {
	fx := fixtures(t)
	p := params{threads: 3, iters: 25, launches: 7, memcpys: 1, mallocs: 1, graphs: 1, streams: 2, driver: 2}
	for _, tc := range []struct {
		name, bin   string
		plain, nvtx []string // arguments without and with NVTX
		lib         string
	}{
		{"linked", fx.Workload, nil, []string{"--nvtx"}, fx.Nvtx},
		{"dlopen", fx.WorkloadDlopen, []string{"--lib", fx.Cudart}, []string{"--lib", fx.Cudart, "--nvtx"}, fx.Nvtx},
		{"nvtx3interop", fx.Workload, nil, []string{"--nvtx-lib", fx.Nvtx3Interop}, fx.Nvtx3Interop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := start(t, tc.bin, append(p.args(), tc.nvtx...))
			plain := start(t, tc.bin, append(p.args(), tc.plain...))
			for _, x := range []*Workload{w, plain} {
				if err := x.Load(); err != nil {
					t.Fatal(err)
				}
				maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", x.PID))
				nvtx := strings.Contains(string(maps), "libnvToolsExt") || strings.Contains(string(maps), "libnvtx3interop")
				if err != nil || nvtx != (x == w) || (x == w && !strings.Contains(string(maps), tc.lib)) {
					t.Errorf("pid %d (NVTX on: %v) maps NVTX wrongly (%v):\n%s", x.PID, x == w, err, maps)
				}
			}
			for phase := uint64(1); phase <= 2; phase++ {
				gt, err := w.Run()
				if err != nil {
					t.Fatal(err)
				}
				base, err := plain.Run()
				if err != nil {
					t.Fatal(err)
				}
				TI := phase * uint64(p.threads*p.iters)
				want := map[string]uint64{"": 2 * TI, "prefill": 2 * TI, "decode": 2 * TI, "attention": TI, "mlp": 2 * TI, "norm": 2 * TI, "other": TI}
				want[""] += sumValues(base.LaunchesByAPI) // every other launch: no range open
				if !reflect.DeepEqual(gt.LaunchesByPhase, want) {
					t.Errorf("launches_by_phase %v, want %v", gt.LaunchesByPhase, want)
				}
				wantCalls := map[string]uint64{"nvtxRangePushA": 7 * TI, "nvtxRangePushW": TI, "nvtxRangePop": 9 * TI,
					"nvtxDomainCreateA": phase * uint64(p.threads), "nvtxDomainRangePushEx": 3 * TI, "nvtxDomainRangePop": 3 * TI}
				if !reflect.DeepEqual(gt.NVTXCalls, wantCalls) {
					t.Errorf("nvtx_calls %v, want %v", gt.NVTXCalls, wantCalls)
				}
				if got, want := gt.Calls["cudaLaunchKernel"], base.Calls["cudaLaunchKernel"]+12*TI; got != want {
					t.Errorf("cudaLaunchKernel calls %d, want %d", got, want)
				}
				if base.LaunchesByPhase != nil || base.NVTXCalls != nil {
					t.Errorf("without --nvtx: launches_by_phase %v, nvtx_calls %v", base.LaunchesByPhase, base.NVTXCalls)
				}
			}
		})
	}
}

// The static-runtime builds look like nvcc's default (-cudart static)
// output: no libcudart NEEDED, the driver NEEDED, the runtime's functions
// in .symtab only (unstripped) or nowhere (stripped).
func TestLaunch13StaticELF(t *testing.T) {
	fx := fixtures(t)
	for bin, wantSymtab := range map[string]bool{fx.Launch13Static: true, fx.Launch13Stripped: false} {
		needed := dynStrings(t, bin, elf.DT_NEEDED)
		if !contains(needed, "libcuda.so.1") || slices.ContainsFunc(needed, func(n string) bool { return strings.HasPrefix(n, "libcudart") }) {
			t.Errorf("%s: NEEDED %q, want libcuda.so.1 and no libcudart", bin, needed)
		}
		if got := dynFuncs(t, bin); len(got) != 0 {
			t.Errorf("%s: .dynsym defines CUDA functions %v, want none", bin, slices.Sorted(maps.Keys(got)))
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		syms, _ := f.Symbols()
		f.Close()
		found := map[string]bool{}
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
				found[s.Name] = true
			}
		}
		for _, name := range slices.Concat([]string{"cudaLaunchKernel", "cudaMalloc"}, cuda13Funcs) {
			if found[name] != wantSymtab {
				t.Errorf("%s: .symtab defines %s = %v, want %v", bin, name, found[name], wantSymtab)
			}
		}
	}
}

// runGraphs runs the graphs workload to the end ("go", then EOF) with the
// environment env and returns its ground truth and stderr.
func runGraphs(t *testing.T, bin string, env []string, args ...string) (GraphsTruth, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader("go\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ready ") {
		t.Fatalf("%s %v: output %q", bin, args, stdout.String())
	}
	var gt GraphsTruth
	if err := json.Unmarshal([]byte(lines[1]), &gt); err != nil {
		t.Fatalf("%s %v: %v in %q", bin, args, err, lines[1])
	}
	return gt, stderr.String()
}

// graphsKernels are the graphs workload's kernel symbols: the runtime's
// host stubs (registered) and the driver's Triton functions.
var graphsKernels = map[string]bool{
	"_Z9gemm_bf16PfS_": true, "_Z8gemm_fp8PfS_": true, "_Z14flash_decodingPfS_i": true,
	"_Z14rms_norm_fusedPf": true, "_Z10early_stepPf": true,
}

func TestGraphsWorkloadELF(t *testing.T) {
	fx := fixtures(t)
	needed := dynStrings(t, fx.Graphs, elf.DT_NEEDED)
	if !contains(needed, "libcudart.so.13") || !contains(needed, "libcuda.so.1") {
		t.Errorf("%s: NEEDED %q, want libcudart.so.13 and libcuda.so.1", fx.Graphs, needed)
	}
	f, err := elf.Open(fx.Graphs)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.DynamicSymbols()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			found[s.Name] = true
		}
	}
	for name := range graphsKernels {
		if !found[name] {
			t.Errorf("%s: kernel host stub %s not in .dynsym", fx.Graphs, name)
		}
	}
}

// The graphs workload checks every return code against CUDA's and the stub
// driver's own tally of what graph launches ran and captures recorded
// against its model (it fails otherwise). Here: its ground truth against
// the structure graphs.c documents, the same whether the runtime launches
// through the driver's exported functions or not, and with an executable
// graph built before "go".
func TestGraphsWorkload(t *testing.T) {
	fx := fixtures(t)
	const n = 8 // replays
	wantErrors := map[string]map[string]uint64{
		"__cudaLaunchKernel": {"901": 1}, "cudaMemcpyAsync": {"901": 1}, "cudaStreamSynchronize": {"900": 1},
		"cudaStreamBeginCapture": {"900": 1, "401": 1}, "cudaStreamEndCapture": {"401": 1, "901": 1, "904": 1},
		"cudaGraphExecUpdate": {"910": 1},
	}
	var viaDriver GraphsTruth
	for _, tc := range []struct {
		name  string
		env   []string
		early uint64
	}{
		{"via-driver", nil, 0},
		{"runtime-only", []string{"PROFI_STUB_LAUNCH=runtime"}, 0},
		{"early", nil, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{strconv.Itoa(n)}
			if tc.early > 0 {
				args = append(args, "early")
			}
			gt, _ := runGraphs(t, fx.Graphs, append(os.Environ(), tc.env...), args...)
			replays := gt.Calls["cudaGraphLaunch"] + gt.Calls["cudaGraphLaunch_ptsz"] +
				gt.Calls["cuGraphLaunch"] + gt.Calls["cuGraphLaunch_ptsz"]
			// Seven executable graphs n times, then two n/4 times each
			// after the updates; the early one n times.
			if replays != 7*n+2*n/4+tc.early {
				t.Errorf("%d graph launches, want %d", replays, 7*n+2*n/4+tc.early)
			}
			// 39 kernels a round of the seven; the updated exec 4, the
			// exec whose update failed 6.
			if got := Sum(gt.GraphKernels); got != 39*n+(4+6)*n/4 {
				t.Errorf("%d graph kernels, want %d", got, 39*n+(4+6)*n/4)
			}
			if gt.UnknownGraphReplays != tc.early || gt.UnknownGraphKernels != 3*tc.early {
				t.Errorf("unknown graph replays %d (kernels %d), want %d (%d)", gt.UnknownGraphReplays,
					gt.UnknownGraphKernels, tc.early, 3*tc.early)
			}
			// Captured: 24 in the batch graphs, 4 in the update's, 3 in
			// the driver's, 3 and 1 in the failed captures. Eager: 16 in
			// the warm-up, 1 after the unjoined capture.
			if Sum(gt.Captured) != 35 || Sum(gt.Launches) != 17 {
				t.Errorf("%d captured launch calls, %d launches: want 35 and 17", Sum(gt.Captured), Sum(gt.Launches))
			}
			if !reflect.DeepEqual(gt.Errors, wantErrors) {
				t.Errorf("errors %v, want %v", gt.Errors, wantErrors)
			}
			if gt.MallocBytes != 2<<20 || gt.ActiveBytes != 0 {
				t.Errorf("malloc %d, active %d: want %d and 0", gt.MallocBytes, gt.ActiveBytes, 2<<20)
			}
			for _, m := range []map[string]uint64{gt.Launches, gt.Captured, gt.GraphKernels} {
				for k := range m {
					if !graphsKernels[k] && !strings.HasPrefix(k, "triton_") {
						t.Errorf("unknown kernel %q", k)
					}
				}
			}
			switch tc.name {
			case "via-driver":
				viaDriver = gt
			case "runtime-only":
				if viaDriver.Calls != nil && !reflect.DeepEqual(gt, viaDriver) {
					t.Errorf("ground truth differs from the via-driver run's:\n%+v\n%+v", gt, viaDriver)
				}
			}
		})
	}
}

// graphsRuntimeImports are the driver functions the stub runtime calls
// for what the graphs workload does (test/stubs/cudart.c lists each
// runtime function's driver counterpart).
var graphsRuntimeImports = []string{
	"cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCaptureToGraph",
	"cuStreamEndCapture", "cuStreamEndCapture_ptsz", "cuStreamIsCapturing", "cuStreamSynchronize",
	"cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventRecordWithFlags", "cuStreamWaitEvent",
	"cuGraphCreate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams", "cuGraphExecUpdate_v2",
	"cuGraphExecDestroy", "cuGraphDestroy", "cuGraphAddKernelNode_v2", "cuGraphAddMemcpyNode",
	"cuGraphAddMemsetNode", "cuGraphAddChildGraphNode", "cuGraphLaunch", "cuGetExportTable",
	"cuLaunchKernel", "cuLaunchKernel_ptsz",
}

// As for launches, the runtime's capture and graph functions reach the
// driver through its exported symbols, where driver uprobes fire.
func TestGraphsRuntimeCallsDriver(t *testing.T) {
	fx := fixtures(t)
	_, stderr := runGraphs(t, fx.Graphs, bindingsEnv(), "4")
	if !strings.Contains(stderr, "binding file") {
		t.Skip("dynamic loader does not report bindings (not glibc?)")
	}
	for _, sym := range graphsRuntimeImports {
		line := fmt.Sprintf("binding file %s [0] to %s [0]: normal symbol `%s'", fx.Cudart13, fx.Cuda, sym)
		if !strings.Contains(stderr, line) {
			t.Errorf("no %q in the loader's bindings", line)
		}
	}
}
