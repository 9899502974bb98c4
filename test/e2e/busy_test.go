package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pstatus "github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// GPU seconds per pod (issue 43): the agent integrates every per-process
// sample the driver returns (the fake libnvidia-ml.so.1 through the real
// go-nvml binding) and folds it into a counter per pod: a workload in a pod
// (its cgroup as kubelet names it, the pod from the API server) and one
// outside Kubernetes, on a GPU and on a MIG device. The samples carry their
// own timestamps, several per call, one repeated, one returned again after
// it was read (stale), and a gap; the totals are worked out by hand from
// the rule of internal/nvml/busy.go (the first timestamp of a device opens
// the count, a sample is its utilization over the time since the device's
// previous timestamp, a gap over a second takes the last period).
func TestGPUBusySecondsPerPod(t *testing.T) {
	testutil.RequireBPF(t)
	const migC = "MIG-cccccccc-1111-2222-3333-444444444444"
	devices := fmt.Sprintf("driver 580.65.06\ngpu %s 00000000:3B:00.0 H100 procutil=ok\ngpu %s 00000000:86:00.0 A100 mig\nmig %s 1 procutil=ok\n", gpuA, gpuB, migC)
	scenario := fakeNVML(t, devices)

	s := podWatchServer(t)
	id := randomContainerID(t)
	pod := createPod(t, s.Client(), "ml", "infer-0", "server", id)
	inPod := startInPod(t, fixtures.Workload, defaultArgs, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+
		strings.ReplaceAll(string(pod.UID), "-", "_")+".slice/cri-containerd-"+id+".scope")
	a := startAgentWith(t, testutil.StartAgentServing, "--node-name", testNode, "--nvml-interval", "1")
	outside := startWorkload(t, fixtures.Workload, defaultArgs)
	for _, w := range []*testutil.Workload{inPod, outside} {
		waitAttached(t, a, w.PID)
		runPhase(t, w)
	}
	requirePodLabels(t, a, inPod.PID, [3]string{"ml", "infer-0", "server"})

	// Timestamps (µs) the agent has not seen: its first poll was earlier.
	b := uint64(time.Now().Add(time.Minute).UnixMicro())
	p, q := inPod.PID, outside.PID
	write := func(lines string) {
		t.Helper()
		if err := testutil.WriteScenario(scenario, devices+lines); err != nil {
			t.Fatal(err)
		}
	}
	first := fmt.Sprintf(`sample %[1]s %[3]d 80 0 0 0 %[5]d
sample %[1]s %[3]d 50 10 0 0 %[6]d
sample %[1]s %[4]d 100 0 0 0 %[6]d
sample %[1]s %[3]d 50 10 0 0 %[6]d
sample %[1]s %[3]d 20 0 0 0 %[7]d
sample %[1]s %[4]d 100 0 0 30 %[8]d
sample %[2]s %[4]d 10 0 0 0 %[5]d
sample %[2]s %[4]d 40 0 0 0 %[9]d
`, gpuA, migC, p, q, b, b+200_000, b+300_000, b+5_300_000, b+100_000)
	write(first)
	// gpuA: b opens; b+200ms (200 ms): pod 50 % sm, 10 % memory (the repeat
	// counts once), outside 100 %; b+300ms (100 ms): pod 20 %; b+5.3s (a
	// gap: the last period, 100 ms): outside 100 % sm, 30 % decoder.
	// migC: b opens; b+100ms (100 ms): outside 40 %.
	want := map[string]float64{
		"0|" + gpuA + "|ml|infer-0|server|sm":     0.5*0.2 + 0.2*0.1,
		"0|" + gpuA + "|ml|infer-0|server|memory": 0.1 * 0.2,
		"0|" + gpuA + "||||sm":                    1.0*0.2 + 1.0*0.1,
		"0|" + gpuA + "||||decoder":               0.3 * 0.1,
		"1|" + migC + "||||sm":                    0.4 * 0.1,
	}
	requireBusy(t, a, want)

	// The driver returns b+300ms again (read already: nothing), and a new
	// sample at b+5.4s (100 ms after b+5.3s): pod 100 %.
	write(first + fmt.Sprintf("sample %s %d 100 100 100 100 %d again\nsample %s %d 100 0 0 0 %d\n", gpuA, p, b+300_000, gpuA, p, b+5_400_000))
	want["0|"+gpuA+"|ml|infer-0|server|sm"] += 1.0 * 0.1
	requireBusy(t, a, want)

	// profi explain: the process's GPU time per device, the same sums.
	procs, _ := explainJSON(t, a, strconv.Itoa(p))
	var got []pstatus.GPUBusy
	for _, s := range procs[0].PerGPU {
		got = append(got, s.GPUBusy...)
	}
	if len(got) != 1 || got[0].UUID != gpuA || abs(got[0].SM-want["0|"+gpuA+"|ml|infer-0|server|sm"]) > 1e-9 ||
		abs(got[0].Memory-want["0|"+gpuA+"|ml|infer-0|server|memory"]) > 1e-9 || got[0].Encoder != 0 || got[0].Decoder != 0 {
		t.Errorf("explain gpu_busy_seconds %+v, want %s: sm %v, memory %v", got, gpuA,
			want["0|"+gpuA+"|ml|infer-0|server|sm"], want["0|"+gpuA+"|ml|infer-0|server|memory"])
	}
}

// requireBusy waits until profi_gpu_process_busy_seconds_total's non-zero
// series, by gpu|gpu_uuid|namespace|pod|container|engine, are want.
func requireBusy(t *testing.T, a *testutil.Agent, want map[string]float64) {
	t.Helper()
	got := map[string]float64{}
	err := testenv.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		clear(got)
		for _, s := range testutil.Samples(mfs["profi_gpu_process_busy_seconds_total"]) {
			if s.Value == 0 {
				continue
			}
			l := s.Labels
			got[strings.Join([]string{l["gpu"], l["gpu_uuid"], l["namespace"], l["pod"], l["container"], l["engine"]}, "|")] = s.Value
		}
		if !maps.EqualFunc(got, want, func(x, y float64) bool { return abs(x-y) < 1e-9 }) {
			return fmt.Errorf("busy seconds differ")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v:\ngot  %v\nwant %v", err, got, slices.Sorted(maps.Keys(want)))
	}
}
