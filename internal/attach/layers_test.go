package attach

import (
	"reflect"
	"testing"
)

// TestLayersRuntimeInsideNCCL: a process whose libnccl is probed and that
// maps no libcudart.so runs NCCL's own runtime, linked into libnccl
// (docs/REAL-CUDA.md): blind, named after libnccl, also where discovery
// took the executable for a stripped static runtime. A libcudart.so or a
// static runtime with symbols beside NCCL keeps its own state.
func TestLayersRuntimeInsideNCCL(t *testing.T) {
	const nccl, cudart, exe = "/lib/libnccl.so.2", "/lib/libcudart.so.12", "/usr/bin/app"
	ncclAtt := LibraryStatus{Path: nccl, Library: "libnccl.so", PIDs: []int{1, 2, 3, 4}}
	st := Status{
		Attached: []LibraryStatus{
			ncclAtt,
			{Path: cudart, Library: "libcudart.so", PIDs: []int{2}},
			{Path: exe, Library: "libcudart.so", Static: true, PIDs: []int{4}},
		},
		Failed: []FailureStatus{{Path: exe, Library: "libcudart.so", Static: true, Reason: ReasonSymbolNotFound, PIDs: []int{3}}},
	}
	inside := Layer{Layer: "runtime", State: "blind", Path: nccl,
		Detail: "runtime linked into libnccl.so.2: its runtime calls are not seen; the driver layer counts its launches and memory"}
	want := map[int]Layer{
		1: inside, // NCCL alone
		2: {Layer: "runtime", State: "probed", Path: cudart},
		3: inside, // the executable has no runtime symbols: NCCL's runtime, not a stripped one
		4: {Layer: "runtime", State: "static", Path: exe, Detail: "runtime linked into the executable, probed there"},
	}
	got := Layers(st)
	for pid, w := range want {
		if l := got[pid]; len(l) == 0 || !reflect.DeepEqual(l[0], w) {
			t.Errorf("pid %d: runtime layer %+v, want %+v", pid, l, w)
		}
	}
}

// TestLayersUnprobed: a traced process left unprobed is "unprobed" in the
// layers of the file it maps, with its tracer; another process of the same
// file is probed.
func TestLayersUnprobed(t *testing.T) {
	const cudart = "/lib/libcudart.so.12"
	st := Status{Attached: []LibraryStatus{{Path: cudart, Library: "libcudart.so", PIDs: []int{1, 2}, ProbedPIDs: []int{1},
		Unprobed: []Unprobed{{PID: 2, Reason: ReasonTraced, TracerPID: 9}}}}}
	want := map[int]Layer{
		1: {Layer: "runtime", State: "probed", Path: cudart},
		2: {Layer: "runtime", State: "unprobed", Path: cudart,
			Detail: "left unprobed, no breakpoint in the process: traced by pid 9 (--probe-traced-processes)"},
	}
	got := Layers(st)
	for pid, w := range want {
		if l := got[pid]; len(l) == 0 || !reflect.DeepEqual(l[0], w) {
			t.Errorf("pid %d: runtime layer %+v, want %+v", pid, l, w)
		}
	}
}
