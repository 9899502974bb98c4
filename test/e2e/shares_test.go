package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// share is the room and the guarantee of a shared map of the given size,
// written out from docs/METRICS.md, "Shares of the shared maps" (the room
// seven eighths of the map, the guarantee half of the last eighth), not
// computed by the code under test (bpfobj.NodeRoom, TestShares).
var share = map[uint32]struct{ room, guarantee float64 }{
	2048:  {1792, 128},
	4096:  {3584, 256},
	65536: {57344, 4096},
}

// Issue 47 item 3: a process whose own runtime accepts cudaSetDevice for
// any ordinal made every ordinal a new key (3,000 ordinals: 6,000 keys
// of aggregated's 2,048); with hostile processes in two cgroups a victim
// got 0 calls. Ordinals past bpfobj.MaxDevices are no device: their
// calls count under one device (DevInvalid). The hostile process's 3,000
// cudaSetDevice and 3,000 copies are all counted, in 2 keys per ordinal
// below the bound and 2 past it; nothing is refused; the victim is exact.
func TestHostileDeviceOrdinals(t *testing.T) {
	a := startAgent(t)
	hostile := startWorkload(t, fixtures.Hostile, []string{"0"}, inNewCgroup(t, "hostile"))
	victim := startWorkload(t, fixtures.Workload, defaultArgs, inNewCgroup(t, "victim"))
	waitAttached(t, a, hostile.PID)
	waitAttached(t, a, victim.PID)
	const n = 3000
	if h, err := hostile.RunHostileCommand("devices " + strconv.Itoa(n)); err != nil || h["devices"] != n {
		t.Fatalf("hostile devices: %v %v", h, err)
	}
	gt := runPhase(t, victim)
	want := expected([]*testutil.GroundTruth{gt})
	var last hostileFigures
	var victimDiff string
	err := testenv.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		f := readHostile(mfs, hostile.PID)
		last = f
		w := values{}
		for k, v := range want {
			w[k] = v
		}
		got := observed(mfs, victim.PID)
		// Histograms carry no pid: they hold the hostile calls of timed operations too.
		for op, v := range f.calls {
			if _, timed := got[key("profi_cuda_duration_count_total", "operation="+op)]; timed {
				addTimed(w, op, v)
			}
		}
		victimDiff = diff(w, got)
		switch {
		case victimDiff != "":
			return fmt.Errorf("victim's metrics differ from its ground truth:\n%s", victimDiff)
		case f.calls["cudaSetDevice"] != n || f.calls["cudaMemcpyAsync"] != n:
			return fmt.Errorf("hostile cudaSetDevice %v and cudaMemcpyAsync %v counted, want %d each", f.calls["cudaSetDevice"], f.calls["cudaMemcpyAsync"], n)
		case f.drops["pid_quota"] != 0 || f.drops["aggregated"] != 0:
			return fmt.Errorf("drops pid_quota %v aggregated %v, want none: the ordinals past %d are one device", f.drops["pid_quota"], f.drops["aggregated"], bpfobj.MaxDevices)
		}
		return nil
	})
	t.Logf("hostile: %v cudaSetDevice, %v copies counted; drops pid_quota %v aggregated %v", last.calls["cudaSetDevice"], last.calls["cudaMemcpyAsync"], last.drops["pid_quota"], last.drops["aggregated"])
	if err != nil {
		t.Fatal(err)
	}
}

// podCgroups makes a kubelet-style pod cgroup below the cgroup v2 root
// (kubepods/burstable/pod<uid>, under a directory of this test's own) and
// the given directories below it, one option per directory to start a
// workload in it; it returns the pod cgroup's id (its inode). The
// directories are removed after the workloads have stopped.
func podCgroups(t *testing.T, uid string, dirs ...string) (uint64, []testutil.Option) {
	t.Helper()
	top := filepath.Join(cgroup2Root(t), fmt.Sprintf("profi-e2e-kubepods-%d", os.Getpid()))
	pod := filepath.Join(top, "burstable", "pod"+uid)
	var made []string // deepest last
	var opts []testutil.Option
	for _, d := range append([]string{""}, dirs...) {
		path := filepath.Join(pod, d)
		for p := path; strings.HasPrefix(p, top); p = filepath.Dir(p) {
			made = append([]string{p}, made...)
		}
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if d == "" {
			continue
		}
		opts = append(opts, intoCgroup(t, path))
	}
	// Registered first, so it runs after the workloads' cleanups: deepest first.
	t.Cleanup(func() {
		_ = testenv.Eventually(5*time.Second, func() error {
			for i := len(made) - 1; i >= 0; i-- {
				if err := os.Remove(made[i]); err != nil && !os.IsNotExist(err) {
					return err
				}
			}
			return nil
		})
	})
	var st unix.Stat_t
	if err := unix.Stat(pod, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino, opts
}

// Issue 47 item 1: the tenant is the pod, however deep its processes
// nest cgroups below it. Two hostile processes of one pod, one in a
// container's cgroup and one in a cgroup nested two deep in another
// container's (as a container that delegates its own cgroups makes), run
// one after the other: the first fills the node's room of aggregated;
// the second, of the same tenant, gets no new key (as its own tenant it
// would have taken a guarantee). Their refusals are the pod's, equal to
// the pid_quota drops; the victim in its own cgroup is exact.
func TestPodTenant(t *testing.T) {
	const uid = "5d3c1e2a-7b4f-4c6d-9e8a-1f2b3c4d5e6f"
	pod, opts := podCgroups(t, uid, "c1", "c2/nested/deeper")
	a := startAgent(t) // after the pod's cgroup: its first scan sees it
	const n = 3000
	hs, victim, want := hostilesThenVictim(t, a, n, opts, inNewCgroup(t, "victim"))
	room := share[2048].room // --aggregated-size's default
	var keys [2]float64
	var victimDiff string
	var refused, drops float64
	err := testenv.Eventually(20*time.Second, func() error {
		mfs, err := a.Metrics()
		if err != nil {
			return err
		}
		w := values{}
		for k, v := range want {
			w[k] = v
		}
		for i, h := range hs {
			f := readHostile(mfs, h.PID)
			for op, v := range f.calls {
				if op != "cudaLaunchKernel" { // anonymous mode: not timed
					addTimed(w, op, v)
				}
			}
			keys[i] = f.aggregatedKeys()
			drops = f.drops["pid_quota"]
		}
		refused = refusalsOf(mfs, pod)
		victimDiff = diff(w, observed(mfs, victim.PID))
		switch {
		case victimDiff != "":
			return fmt.Errorf("victim's metrics differ from its ground truth:\n%s", victimDiff)
		case keys != [2]float64{room, 0}:
			return fmt.Errorf("the pod's processes hold %v aggregated keys, want the node's room %v and none", keys, room)
		case refused != drops || refused == 0:
			return fmt.Errorf("the pod's refusals %v, want the pid_quota drops %v", refused, drops)
		}
		return nil
	})
	t.Logf("pod cgroup %d: keys %v, refusals %v, pid_quota drops %v", pod, keys, refused, drops)
	if err != nil {
		t.Fatal(err)
	}
}

// hostilesThenVictim starts one hostile workload of n per option in
// hostiles (each in that cgroup) and a victim workload in victimCg, waits
// until all are attached, runs the hostile ones one after the other, then
// the victim's phase, and returns the hostile workloads, the victim and
// its expected series.
func hostilesThenVictim(t *testing.T, a *testutil.Agent, n int, hostiles []testutil.Option, victimCg testutil.Option) ([]*testutil.Workload, *testutil.Workload, values) {
	t.Helper()
	var hs []*testutil.Workload
	for _, o := range hostiles {
		hs = append(hs, startWorkload(t, fixtures.Hostile, []string{strconv.Itoa(n)}, o))
	}
	victim := startWorkload(t, fixtures.Workload, defaultArgs, victimCg)
	for _, h := range hs {
		waitAttached(t, a, h.PID)
	}
	waitAttached(t, a, victim.PID)
	for _, h := range hs {
		if got, err := h.RunHostile(); err != nil || got.N != n {
			t.Fatalf("hostile run: %+v %v", got, err)
		}
	}
	return hs, victim, expected([]*testutil.GroundTruth{runPhase(t, victim)})
}

// intoCgroup returns the option that starts a workload in the cgroup v2
// directory dir (clone3 CLONE_INTO_CGROUP: in it from its first
// instruction, so its tenant is fixed by that cgroup from its first key).
func intoCgroup(t *testing.T, dir string) testutil.Option {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return testutil.WithSysProcAttr(&syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd})
}
