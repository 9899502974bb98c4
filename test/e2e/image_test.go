package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/profi-dev/profi/internal/testutil"
)

// TestImageUnderChartSecurityContext builds the image without a registry
// (scripts/build-image.sh: FROM scratch, the agent the other tests run, the
// glibc it links, Debian's CA bundle) and runs it under podman exactly as the
// chart's DaemonSet asks: the pod spec comes from `helm template`, and every
// field the chart sets is translated into a podman flag or the test fails
// (podmanRunArgs): hostPID, root with every capability dropped but BPF,
// PERFMON, SYS_PTRACE and SYSLOG, no privilege escalation, a read-only root, the
// host's /proc read-only at /host/proc, the memory and CPU limits, the
// chart's arguments and environment, and seccompProfile RuntimeDefault. The
// init container (`profi check`) runs first, as the kubelet would.
//
// RuntimeDefault is the container runtime's profile, and runtimes differ:
//   - containerd (1.6.9+) and Docker (23+) allow bpf with CAP_BPF and
//     perf_event_open with CAP_PERFMON: there the check passes and the agent
//     in the image counts a workload on the host exactly;
//   - podman and CRI-O (containers-common) allow them with CAP_SYS_ADMIN
//     only: there both the check and the agent are refused bpf() (EPERM).
//
// containerd's profile is podman's with containerd's rules for those two
// calls (containerdRuntimeDefault). The network is the host's: no CNI here,
// and the chart's listen address is a loopback port (profi.listen).
func TestImageUnderChartSecurityContext(t *testing.T) {
	testutil.RequireBPF(t)
	p := requirePodman(t)
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	const image = "localhost/profi:e2e"
	spec := renderPod(t, "image.repository=localhost/profi", "image.tag=e2e", "profi.listen="+addr,
		"profi.intervals.refreshSeconds=1")
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "check" || len(spec.Containers) != 1 {
		t.Fatalf("want one init container check and one container: %+v", spec)
	}
	check, agent := spec.InitContainers[0], spec.Containers[0]
	if agent.Image != image || check.Image != image {
		t.Fatalf("images %q, %q; want %q", check.Image, agent.Image, image)
	}
	if sp := agent.SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("the chart's seccompProfile is %+v, want RuntimeDefault", sp)
	}
	start := time.Now()
	p.buildImage(t, agentBin, image)
	t.Logf("image built in %v", time.Since(start).Round(time.Millisecond))
	podmanProfile := p.seccompProfile(t)
	containerdProfile := containerdRuntimeDefault(t, podmanProfile, p.dir)
	name := fmt.Sprintf("profi-e2e-%d", os.Getpid())

	t.Run("containerd RuntimeDefault", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := podmanRunArgs(t, spec, check, name+"-check", containerdProfile)
		t.Logf("init container: podman %s", strings.Join(args, " "))
		out, code := p.run(ctx, append([]string{"podman"}, args...)...)
		if code != 0 || !strings.Contains(out, "\nready: ") || !strings.Contains(out, "OK    uprobe_attach      a uprobe_multi link") {
			t.Fatalf("profi check in the image: exit %d, want 0 with a uprobe_multi probe counted:\n%s", code, out)
		}

		args = podmanRunArgs(t, spec, agent, name, containerdProfile)
		t.Logf("agent: podman %s", strings.Join(args, " "))
		a, err := testutil.StartAgentCommand(context.Background(), addr, "/ready", p.command(append([]string{"podman"}, args...)...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := a.Stop(); err != nil {
				t.Errorf("agent container did not exit cleanly: %v\n%s", err, a.Logs())
			}
			if t.Failed() {
				t.Logf("agent log:\n%s", a.Logs())
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p.run(ctx, "podman", "rm", "--force", "--ignore", name)
		})
		if code, _, err := a.Get("/health"); err != nil || code != 200 {
			t.Fatalf("/health: %d %v", code, err)
		}
		requireConstraints(t, p, name, agent)

		w := startWorkload(t, fixtures.Workload, defaultArgs)
		waitAttached(t, a, w.PID)
		gt := runPhase(t, w)
		requireExact(t, a, expected([]*testutil.GroundTruth{gt}), w.PID)
		t.Logf("the agent in the image counted pid %d exactly: %d calls, %d launches", w.PID, gt.TotalCalls(), gt.Launches)
	})

	t.Run("podman RuntimeDefault", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, code := p.run(ctx, append([]string{"podman"}, podmanRunArgs(t, spec, check, name+"-check", "")...)...)
		if code != 1 || !strings.Contains(out, "FAIL  bpf_load           creating a BPF map failed") ||
			!strings.Contains(out, "operation not permitted") || !strings.Contains(out, "Seccomp: 2") {
			t.Fatalf("profi check under podman's default seccomp profile (%s): exit %d, want 1 with bpf() refused under seccomp:\n%s", podmanProfile, code, out)
		}
		out, code = p.run(ctx, append([]string{"podman"}, podmanRunArgs(t, spec, agent, name+"-refused", "")...)...)
		if code == 0 || !strings.Contains(out, "operation not permitted") {
			t.Fatalf("agent under podman's default seccomp profile: exit %d, want a failure to create BPF maps:\n%s", code, out)
		}
		t.Logf("podman's RuntimeDefault (%s) refuses bpf() without CAP_SYS_ADMIN: %s", podmanProfile, firstLine(out, "operation not permitted"))
	})
}

// requireConstraints checks, from the host, the running container's
// process: exactly the chart's capabilities (effective, permitted and
// bounding), no_new_privs, a seccomp filter, the host's PID namespace, a
// read-only root and /proc mount, and the memory limit.
func requireConstraints(t *testing.T, p *podman, name string, c corev1.Container) {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(p.must(t, "podman", "inspect", "--format", "{{.State.Pid}}", name)))
	if err != nil || pid <= 0 {
		t.Fatalf("container %s pid: %v", name, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	caps := fmt.Sprintf("%016x", capMask(t, c.SecurityContext.Capabilities.Add))
	want := map[string]string{"CapEff": caps, "CapPrm": caps, "CapBnd": caps, "NoNewPrivs": "1", "Seccomp": "2"}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("container process %d: %s %s, want %s", pid, k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("container process %d: no %v in its status", pid, want)
	}
	for _, ns := range []string{"pid"} {
		in, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		host, err2 := os.Readlink("/proc/self/ns/" + ns)
		if err1 != nil || err2 != nil || in != host {
			t.Errorf("container %s namespace %s (%v), host %s (%v): want the host's", ns, in, err1, host, err2)
		}
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	ro := map[string]bool{"/": false, "/host/proc": false}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 {
			if _, ok := ro[f[4]]; ok {
				ro[f[4]] = strings.HasPrefix(f[5], "ro,") || f[5] == "ro"
			}
		}
	}
	for m, isRO := range ro {
		if !isRO {
			t.Errorf("container mount %s is not read-only:\n%s", m, mounts)
		}
	}
	if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		if got := memoryLimit(t, pid); got != mem.Value() {
			t.Errorf("container memory limit %d, want %d", got, mem.Value())
		}
	}
}

// memoryLimit reads the memory limit of a process's cgroup (v1 memory
// controller or v2).
func memoryLimit(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var file string
		switch {
		case strings.Contains(","+f[1]+",", ",memory,"):
			file = filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.limit_in_bytes")
		case f[0] == "0" && f[1] == "":
			file = filepath.Join("/sys/fs/cgroup", f[2], "memory.max")
			if _, err := os.Stat(file); err != nil {
				continue // hybrid layout: the v2 tree has no memory controller
			}
		default:
			continue
		}
		v, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return n
	}
	t.Fatalf("no memory cgroup in /proc/%d/cgroup:\n%s", pid, b)
	return 0
}

// firstLine returns the first line of s containing sub.
func firstLine(s, sub string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
