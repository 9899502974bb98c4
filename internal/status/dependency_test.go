package status_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOperatorToolsStayLight checks that the operator tools, which read
// /status and /metrics from outside the agent, link neither the BPF
// library nor the cgo NVML binding, nor the agent packages that do.
func TestOperatorToolsStayLight(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go binary to list dependencies:", err)
	}
	const mod = "github.com/profi-dev/profi/internal/"
	out, err := exec.Command(gobin, "list", "-deps", mod+"status", mod+"explain", mod+"top").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	heavy := []string{"github.com/cilium/ebpf", "github.com/NVIDIA/go-nvml", "k8s.io/client-go",
		mod + "bpfobj", mod + "aggregate", mod + "attach", mod + "nvml", mod + "collector", mod + "k8s"}
	for _, dep := range strings.Fields(string(out)) {
		for _, h := range heavy {
			if dep == h || strings.HasPrefix(dep, h+"/") {
				t.Errorf("explain/top/status depend on %s", dep)
			}
		}
	}
}
