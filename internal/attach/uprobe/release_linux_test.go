package uprobe

import (
	"testing"

	"github.com/profi-dev/profi/internal/bpfobj"

	"github.com/profi-dev/profi/internal/testutil"
)

// MeasureRelease links and releases real links on the test binary's own
// entry point, of both kinds where the kernel has them; the time is only
// logged (docs/OPERATIONS.md, "Descriptors and teardown"): no test
// asserts how long anything took.
func TestMeasureRelease(t *testing.T) {
	testutil.RequireBPF(t)
	for _, multi := range []bool{false, true} {
		if multi && bpfobj.HaveUprobeMulti() != nil {
			continue
		}
		l := &Linker{Multi: multi}
		d, err := l.MeasureRelease(2)
		if err != nil {
			t.Fatalf("multi %v: %v", multi, err)
		}
		t.Logf("uprobe_multi %v: %v per link released", multi, d)
	}
}
