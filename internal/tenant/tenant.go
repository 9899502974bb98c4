// Package tenant finds the node's pod cgroups, so that BPF counts the
// processes of a pod as one tenant of the shared maps however deep they
// nest cgroups below it (bpf/quota.h tenant_of; docs/METRICS.md, "Shares
// of the shared maps"). Without Kubernetes it finds none and the tenant
// stays each process's own cgroup. Of names the same tenant from
// /proc/PID/cgroup for the attacher's shares of the attach budget.
package tenant

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/status"
)

// Roots is the BPF map of pod cgroups (tenant_roots), keyed by cgroup id.
type Roots interface {
	Put(id uint64) error
	Delete(id uint64) error
}

// MaxDepth is how deep below the cgroup v2 root a pod cgroup is looked
// for: kubelet's own layouts put it at depth 2 or 3 (kubepods/pod<uid>,
// kubepods/burstable/pod<uid>, kubepods.slice/kubepods-burstable.slice/
// kubepods-burstable-pod<uid>.slice), kind's nested kubelet one deeper.
const MaxDepth = 6

// MaxPods bounds the pod cgroups kept (tenant_roots' size): past it, a
// pod's containers are tenants of their own, as without this package.
const MaxPods = 4096

// ScanInterval is how often the agent scans for pod cgroups. kubelet
// creates a pod's cgroup before its containers (pod create to Running
// takes 0.35-0.85 s on the test suite's node), and a CUDA process makes
// its first key after loading its libraries and initialising the driver;
// one that is quicker is its container's own tenant (Run).
const ScanInterval = time.Second

// Scanner keeps Roots equal to the pod cgroups below Dir.
type Scanner struct {
	// Dir is the cgroup v2 hierarchy as the agent sees it (FindDir).
	Dir   string
	Roots Roots
	Log   *slog.Logger
	known map[uint64]string // cgroup id → path, what Roots holds

	mu     sync.Mutex
	status status.PodCgroups // for /status, after each scan
}

// Status is what the last scan found (/status pod_cgroups); a nil
// Scanner (no cgroup v2 hierarchy found) reports none.
func (s *Scanner) Status() *status.PodCgroups {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	return &st
}

// FindDir returns where the host's cgroup v2 hierarchy is, seen through
// procRoot (the host's /proc: --proc-path): PID 1's root, at the mount
// point PID 1's mountinfo gives for cgroup2 (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on a hybrid node). Where PID 1 cannot be read
// (an init that is not dumpable, as a microVM's can be), kthreadd's (PID
// 2: a kernel thread, in the host's first mount namespace), then the
// agent's own mount of it.
func FindDir(procRoot string) (string, error) {
	var errs []error
	for _, pid := range []string{"1", "2", "self"} {
		mnt, err := cgroup2Mount(filepath.Join(procRoot, pid, "mountinfo"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dir := mnt
		if pid != "self" {
			dir = filepath.Join(procRoot, pid, "root", mnt)
		}
		if _, err := os.ReadDir(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		return dir, nil
	}
	return "", fmt.Errorf("find the cgroup v2 hierarchy: %w", errors.Join(errs...))
}

// cgroup2Mount returns the mount point of the whole cgroup2 hierarchy
// (its root "/", not a cgroup namespace's part of it) in a mountinfo file.
func cgroup2Mount(mountinfo string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if f := strings.Fields(pre); ok && strings.HasPrefix(post, "cgroup2 ") && len(f) >= 5 && f[3] == "/" {
			return unescape(f[4]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", mountinfo, err)
	}
	return "", fmt.Errorf("%s: no cgroup2 mount", mountinfo)
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Scan walks Dir for pod cgroups and puts new ones into Roots, deleting
// those gone. It descends only into directories whose name contains
// "kube" (kubelet's, and kind's kubelet.slice) and below them (the QoS
// classes), never into a pod, so it reads a handful of directories
// however many services a node runs.
func (s *Scanner) Scan() (added, removed int, err error) {
	if s.known == nil {
		s.known = map[uint64]string{}
	}
	found := map[uint64]string{}
	var walk func(dir string, depth int, inKube bool)
	walk = func(dir string, depth int, inKube bool) {
		ents, e := os.ReadDir(dir)
		if e != nil {
			if depth == 0 {
				err = fmt.Errorf("read %s: %w", dir, e)
			}
			return // gone meanwhile
		}
		for _, ent := range ents {
			if !ent.IsDir() {
				continue
			}
			name, path := ent.Name(), filepath.Join(dir, ent.Name())
			switch {
			case k8s.IsPodCgroup(name):
				if id, ok := cgroupID(path); ok && len(found) < MaxPods {
					found[id] = path
				}
			case depth+1 < MaxDepth && (inKube || strings.Contains(name, "kube")):
				walk(path, depth+1, true)
			}
		}
	}
	walk(s.Dir, 0, false)
	defer func() {
		s.mu.Lock()
		s.status = status.PodCgroups{Dir: s.Dir, Pods: len(s.known), LastScan: time.Now()}
		if err != nil {
			s.status.Error = err.Error()
		}
		s.mu.Unlock()
	}()
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	for id := range s.known {
		if _, ok := found[id]; ok {
			continue
		}
		if e := s.Roots.Delete(id); e != nil {
			errs = append(errs, fmt.Errorf("forget pod cgroup %s: %w", s.known[id], e))
			continue
		}
		delete(s.known, id)
		removed++
	}
	for id, path := range found {
		if _, ok := s.known[id]; ok {
			continue
		}
		if e := s.Roots.Put(id); e != nil {
			errs = append(errs, fmt.Errorf("note pod cgroup %s: %w", path, e))
			continue
		}
		s.known[id] = path
		added++
	}
	return added, removed, errors.Join(errs...)
}

// cgroupID is the id of the cgroup at path: its directory's inode number
// on cgroup v2 (what bpf_get_current_cgroup_id returns).
func cgroupID(path string) (uint64, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}

// Run scans every interval until ctx ends. A pod's cgroup exists before
// its containers start (kubelet creates it first), so a scan between the
// two makes the pod one tenant from its processes' first keys; a process
// whose first key came before its pod was seen stays its container's own
// tenant (docs/METRICS.md).
func (s *Scanner) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var failing bool
	for {
		added, removed, err := s.Scan()
		switch {
		case err != nil && !failing:
			s.Log.Warn("pod cgroups: scan failed; retrying", "dir", s.Dir, "err", err)
		case err == nil && (added > 0 || removed > 0):
			s.Log.Debug("pod cgroups", "added", added, "removed", removed, "known", len(s.known))
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// MapRoots is Roots over the BPF map tenant_roots.
type MapRoots struct{ Map *ebpf.Map }

// Put notes pod cgroup id.
func (r MapRoots) Put(id uint64) error { return r.Map.Put(id, uint8(1)) }

// Delete forgets pod cgroup id; one already gone is not an error.
func (r MapRoots) Delete(id uint64) error {
	if err := r.Map.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// Of returns a process's tenant as the attacher's shares name it
// (internal/attach/shares.go): "pod:<uid>" for a process of a pod
// (k8s.ParseCgroup, however deep below the pod it nests), else
// "cgroup:<path>" from its cgroup v2 line (relative to the agent's cgroup
// namespace: two processes of one cgroup read the same path), read
// through procRoot; "" when /proc/PID/cgroup cannot be read (the process
// alone, then).
func Of(procRoot string) func(pid int) string {
	return func(pid int) string {
		b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
		if err != nil {
			return ""
		}
		return Key(b)
	}
}

// Key is the tenant of the contents of a /proc/PID/cgroup file (Of).
func Key(cgroup []byte) string {
	if c, ok := k8s.ParseCgroup(cgroup); ok {
		return "pod:" + c.PodUID
	}
	for line := range strings.Lines(string(cgroup)) {
		if p, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "0::"); ok {
			return "cgroup:" + p
		}
	}
	return ""
}
