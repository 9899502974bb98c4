package e2e

import (
	"testing"
)

// /status says which optional kernel features are in use (so which
// fallbacks are active) and why GPU metrics are missing: this machine has
// uprobe_multi and the sched_process_exit tracepoint, and no NVIDIA driver.
func TestStatusFeaturesAndNVML(t *testing.T) {
	a := startAgent(t)
	var st struct {
		KernelFeatures *struct {
			UprobeMulti bool `json:"uprobe_multi"`
			ExitHook    bool `json:"exit_hook"`
		} `json:"kernel_features"`
		NVML *struct {
			Up     bool   `json:"up"`
			Reason string `json:"reason"`
		} `json:"nvml"`
	}
	if err := a.Status(&st); err != nil {
		t.Fatal(err)
	}
	if st.KernelFeatures == nil || !st.KernelFeatures.UprobeMulti || !st.KernelFeatures.ExitHook {
		t.Errorf("kernel_features = %+v; want uprobe_multi and exit_hook on this kernel", st.KernelFeatures)
	}
	if st.NVML == nil || st.NVML.Up || st.NVML.Reason == "" {
		t.Errorf("nvml = %+v; want down with a reason (no driver here)", st.NVML)
	}

	b := startAgent(t, "--disable-nvml", "--no-uprobe-multi")
	var st2 struct {
		KernelFeatures struct {
			UprobeMulti bool `json:"uprobe_multi"`
		} `json:"kernel_features"`
		NVML *struct{} `json:"nvml"`
	}
	if err := b.Status(&st2); err != nil {
		t.Fatal(err)
	}
	if st2.KernelFeatures.UprobeMulti || st2.NVML != nil {
		t.Errorf("with --disable-nvml --no-uprobe-multi: %+v; want uprobe_multi off and no nvml", st2)
	}
}
