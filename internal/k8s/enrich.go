package k8s

import (
	"sync"

	"github.com/profi-dev/profi/internal/discover"
)

// maxCgroupFile bounds how much of /proc/PID/cgroup is read: one line per
// hierarchy, each a path of at most PATH_MAX.
const maxCgroupFile = 64 << 10

// PodSource looks pods up by UID (a *Watcher).
type PodSource interface {
	Lookup(c Container) (Pod, bool)
}

// Enricher answers the aggregator's question "which pod is this process
// in" from /proc/PID/cgroup and the pod watch.
type Enricher struct {
	Pods     PodSource
	ProcRoot string

	mu sync.Mutex
	// containers are the parsed cgroups of the processes the aggregator
	// asked about (Pod), by PID, each for the process that started at
	// its start time: a new process reusing the PID is parsed afresh.
	containers map[int]cgroupEntry
}

type cgroupEntry struct {
	start uint64
	c     *Container // nil: not in a pod
}

// Pod returns the labels of pid, the process that started at start
// (field 22 of its stat). done is false while they may still change: the
// pod is not in the watch's cache yet, or its status does not list the
// container yet; the aggregator asks again on the next drain, so a process
// seen before its pod is labelled as soon as the pod arrives. A process
// that is in no pod is done at once, with empty labels, and so is one
// whose PID no longer belongs to the process that started at start.
func (e *Enricher) Pod(pid int, start uint64) (namespace, pod, container string, done bool) {
	c, ok := e.container(pid, start)
	if !ok || c == nil {
		return "", "", "", true
	}
	p, ok := e.Pods.Lookup(*c)
	if !ok {
		return "", "", "", false
	}
	name, ok := p.Containers[c.ID]
	return p.Namespace, p.Name, name, ok
}

// PodOfCgroup returns the labels of a process that was in cgroup path
// and is gone: the pod watch's, now, since it will not be asked again.
func (e *Enricher) PodOfCgroup(path string) (namespace, pod, container string) {
	c, ok := parsePath(path)
	if !ok {
		return "", "", ""
	}
	p, ok := e.Pods.Lookup(c)
	if !ok {
		return "", "", ""
	}
	return p.Namespace, p.Name, p.Containers[c.ID]
}

// FullMode reports whether pid's pod is annotated profi/mode: full. It is
// false while the pod is unknown and turns true once the watch has it.
// The attacher asks it for every process that maps a library, most of
// which never make a probed call and so are never forgotten: it uses the
// cache only for the very process (same start time) and never fills it.
func (e *Enricher) FullMode(pid int) bool {
	pd, err := discover.OpenProc(e.root(), pid, 0)
	if err != nil {
		return false
	}
	defer pd.Close()
	start, err := pd.StartTime()
	if err != nil {
		return false
	}
	e.mu.Lock()
	ent, ok := e.containers[pid]
	e.mu.Unlock()
	c := ent.c
	if !ok || ent.start != start {
		c = readContainer(pd)
	}
	if c == nil {
		return false
	}
	p, ok := e.Pods.Lookup(*c)
	return ok && p.FullMode
}

// container parses the cgroup of the process pid that started at start,
// once. ok is false when that process is gone (or the PID is another's).
func (e *Enricher) container(pid int, start uint64) (c *Container, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.containers == nil {
		e.containers = map[int]cgroupEntry{}
	}
	if ent, ok := e.containers[pid]; ok && ent.start == start {
		return ent.c, true
	}
	// The start time and the cgroup are read through one pinned
	// /proc/PID, so both belong to the same process.
	pd, err := discover.OpenProc(e.root(), pid, start)
	if err != nil {
		return nil, false
	}
	defer pd.Close()
	c = readContainer(pd)
	e.containers[pid] = cgroupEntry{start: start, c: c}
	return c, true
}

// readContainer parses the process's cgroup file; nil when it is in no
// pod or the file cannot be read.
func readContainer(pd *discover.Proc) *Container {
	b, err := pd.ReadFile("cgroup", maxCgroupFile)
	if err != nil {
		return nil
	}
	if c, ok := ParseCgroup(b); ok {
		return &c
	}
	return nil
}

func (e *Enricher) root() string {
	if e.ProcRoot == "" {
		return discover.DefaultProcRoot
	}
	return e.ProcRoot
}

// Forget drops what is known about an exited process.
func (e *Enricher) Forget(pid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.containers, pid)
}

// Cached is how many processes the cache holds (for tests).
func (e *Enricher) Cached() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.containers)
}
