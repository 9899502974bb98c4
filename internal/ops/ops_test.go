package ops

import (
	"math"
	"os"
	"testing"
)

// The generated files are what the table says now.
func TestGeneratedFilesCurrent(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{HeaderPath: CHeader(), ConstsPath: GoConsts()} {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s is stale: run go generate ./internal/ops", path)
		}
	}
	doc, err := os.ReadFile(DocPath)
	if err != nil {
		t.Fatal(err)
	}
	if spliced, err := SpliceDoc(string(doc)); err != nil || spliced != string(doc) {
		t.Errorf("%s is stale (%v): run go generate ./internal/ops", DocPath, err)
	}
}

func TestCName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"CudaMemcpy2DAsync":    "CUDA_MEMCPY_2D_ASYNC",
		"CudaMemcpy2DPtds":     "CUDA_MEMCPY_2D_PTDS",
		"CuLaunchKernelPtsz":   "CU_LAUNCH_KERNEL_PTSZ",
		"NcclAllToAll":         "NCCL_ALL_TO_ALL",
		"CudaRegisterFunction": "CUDA_REGISTER_FUNCTION",
		"CudaLaunchKernelExC":  "CUDA_LAUNCH_KERNEL_EX_C",
	} {
		if got := cName(in); got != want {
			t.Errorf("cName(%s) = %s, want %s", in, got, want)
		}
	}
}

// Every row is consistent: unique constants and symbols, a known base,
// kinds that match families, layouts that match kinds.
func TestTable(t *testing.T) {
	t.Parallel()
	consts, syms := map[string]bool{}, map[string]Row{}
	for _, r := range Table {
		if consts[r.Const] {
			t.Errorf("constant %s twice", r.Const)
		}
		if _, ok := syms[r.Symbol]; ok {
			t.Errorf("symbol %s twice", r.Symbol)
		}
		consts[r.Const], syms[r.Symbol] = true, r
	}
	for _, r := range Table {
		if r.Base != "" {
			b, ok := syms[r.Base]
			if !ok {
				t.Errorf("%s: base %s is not a row", r.Symbol, r.Base)
				continue
			}
			if b.Args != r.Args || b.Family != r.Family || b.Kind != r.Kind || b.Pausable != r.Pausable || b.Lib != r.Lib {
				t.Errorf("%s differs from its base %s: %+v vs %+v", r.Symbol, r.Base, r, b)
			}
		}
		if (r.Family == FamilyLaunch) != (r.Kind == Launch) {
			t.Errorf("%s: family launch = %v but kind %d", r.Symbol, r.Family == FamilyLaunch, r.Kind)
		}
		if r.Kind == Launch && !r.RuntimeLaunch() && !r.DriverLaunch() {
			t.Errorf("%s: launch without a launch layout", r.Symbol)
		}
		if (r.Kind == NCCL || r.Kind == NCCLCount) != (r.Lib == nccl) || (r.Kind == NVTXPush || r.Kind == NVTXPop) != (r.Lib == nvtx) {
			t.Errorf("%s: kind %d in %s", r.Symbol, r.Kind, r.Lib)
		}
		if r.Pausable && (r.Family == FamilyMalloc || r.Family == FamilyFree || r.Lib != rt && r.Lib != drv || r.Kind == NameSource || r.Kind == Registration) {
			t.Errorf("%s is pausable but keeps state later calls need", r.Symbol)
		}
	}
	if len(argsNames) != int(NumArgs) {
		t.Errorf("%d layout names for %d layouts", len(argsNames), NumArgs)
	}
}

func TestInfo(t *testing.T) {
	t.Parallel()
	if Info(OpUnknown).Name() != "unknown" || Info(NumOps).Name() != "unknown" || Name(1<<31) != "unknown" {
		t.Error("ids out of range must be unknown")
	}
	if Info(OpCudaStreamSync).Name() != "cudaStreamSync" || Info(OpCudaMalloc).Name() != "cudaMalloc" {
		t.Error("labels")
	}
	if !IsDriver(OpCuLaunchKernel) || IsDriver(OpCudaLaunchKernel) {
		t.Error("IsDriver")
	}
}

func TestName(t *testing.T) {
	t.Parallel()
	// The operation labels of docs/INTERFACE.md 5.2.
	tests := []struct {
		op   uint32
		want string
	}{
		{uint32(OpUnknown), "unknown"},
		{uint32(OpCudaMalloc), "cudaMalloc"},
		{uint32(OpCudaFree), "cudaFree"},
		{uint32(OpCudaMemcpy), "cudaMemcpy"},
		{uint32(OpCudaMemcpyAsync), "cudaMemcpyAsync"},
		{uint32(OpCudaLaunchKernel), "cudaLaunchKernel"},
		{uint32(OpCudaMallocAsync), "cudaMallocAsync"},
		{uint32(OpCudaFreeAsync), "cudaFreeAsync"},
		{uint32(OpCudaGraphLaunch), "cudaGraphLaunch"},
		{uint32(OpCudaGraphInstantiate), "cudaGraphInstantiate"},
		{uint32(NumOps), "unknown"},
		{1000, "unknown"},
		{math.MaxUint32, "unknown"},
	}
	for _, tc := range tests {
		if got := Name(tc.op); got != tc.want {
			t.Errorf("Name(%d) = %q, want %q", tc.op, got, tc.want)
		}
	}
	// Every operation but OP_UNKNOWN has a name of its own.
	seen := map[string]Op{}
	for op := OpUnknown + 1; op < NumOps; op++ {
		name := Name(uint32(op))
		if name == "unknown" {
			t.Errorf("operation %d has no name", op)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("operations %d and %d are both %q", prev, op, name)
		}
		seen[name] = op
	}
}

func TestCookie(t *testing.T) {
	t.Parallel()
	tests := []struct {
		op   Op
		file uint32
		want uint64
	}{
		{OpCudaMemcpy, 0, 3},
		{OpCudaMemcpy, 7, 7<<32 | 3},
		{OpCudaLaunchKernel, math.MaxUint32, 0xffffffff_00000005},
	}
	for _, tc := range tests {
		got := Cookie(tc.op, tc.file)
		if got != tc.want {
			t.Errorf("Cookie(%d, %d) = %#x, want %#x", tc.op, tc.file, got, tc.want)
		}
		// COOKIE_OP and COOKIE_FILE of types.h.
		if Op(uint32(got)) != tc.op || uint32(got>>32) != tc.file {
			t.Errorf("Cookie(%d, %d) = %#x does not unpack", tc.op, tc.file, got)
		}
	}
}
