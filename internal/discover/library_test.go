package discover

import "testing"

func TestClassify(t *testing.T) {
	tests := []struct {
		path string
		want Library
		ok   bool
	}{
		{"libcudart.so", LibCudart, true},
		{"/usr/local/cuda/lib64/libcudart.so", LibCudart, true},
		{"/usr/local/cuda/lib64/libcudart.so.12", LibCudart, true},
		{"/usr/local/cuda/lib64/libcudart.so.12.4.127", LibCudart, true},
		{"/opt/my libs/libcudart.so.11.0", LibCudart, true},
		{"/usr/lib/x86_64-linux-gnu/libcuda.so", LibCuda, true},
		{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", LibCuda, true},
		{"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", LibCuda, true},
		{"/usr/lib/libnccl.so", LibNCCL, true},
		{"/usr/lib/libnccl.so.2", LibNCCL, true},
		{"/usr/lib/libnccl.so.2.21.5", LibNCCL, true},
		{"/libcuda.so.1", LibCuda, true},
		{"/usr/local/cuda/lib64/libnvToolsExt.so.1", LibNVTX, true},
		{"/usr/lib/libnvToolsExt.so", LibNVTX, true},
		{"/site-packages/nvtx/lib/libnvtx3interop.so.1", LibNVTX, true},
		{"/usr/lib/libnvtx3interop.so", LibNVTX, true},
		{"/usr/lib/libnvtoolsext.so.1", "", false},
		{"/usr/lib/libnvToolsExt.so.1.bak", "", false},

		{"", "", false},
		{"/", "", false},
		{"lib", "", false},
		{"lib.so", "", false},
		{"libcudart", "", false},
		{"/usr/lib/libcudart_static.a", "", false},
		{"/usr/lib/libcudart.so.bak", "", false},
		{"/usr/lib/libcudart.so.12.", "", false},
		{"/usr/lib/libcudart.so..12", "", false},
		{"/usr/lib/libcudart.so12", "", false},
		{"/usr/lib/libcudart.so.12a", "", false},
		{"/usr/lib/libcudart.so.-1", "", false},
		{"/usr/lib/libcudadebugger.so", "", false},
		{"/usr/lib/libcudadebugger.so.1", "", false},
		{"/usr/lib/libnccl-net.so", "", false},
		{"/usr/lib/libnccl_static.a", "", false},
		{"/usr/lib/libcuda.so-foo", "", false},
		{"/usr/lib/libcuda.sox", "", false},
		{"/usr/lib/libcudart-d0da41ae.so.11.0", "", false},
		{"/usr/lib/libcuda.so.1 (deleted)", "", false},
		{"/usr/lib/LIBCUDA.SO.1", "", false},
		{"/usr/lib/libcuda.so.1/", "", false},
		{"/usr/lib/libcuda.so.1/libc.so.6", "", false},
		{"libcudart.so/libcuda.so", LibCuda, true},
		{"[anon:libcuda.so]", "", false},
		{"/usr/lib/libcublas.so.12", "", false},
		{"/usr/lib/libcudnn.so.9", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, ok := Classify(tt.path)
			if got != tt.want || ok != tt.ok {
				t.Errorf("Classify(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
			}
			if got, ok := classify([]byte(tt.path)); got != tt.want || ok != tt.ok {
				t.Errorf("classify([]byte(%q)) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestClassifyNoAlloc(t *testing.T) {
	line := []byte("/usr/local/cuda/lib64/libcudart.so.12.4.127")
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := classify(line); !ok {
			t.Fatal("not classified")
		}
	})
	if allocs != 0 {
		t.Errorf("classify allocates %v times per call", allocs)
	}
}
