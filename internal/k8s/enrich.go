package k8s

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// PodSource looks pods up by UID (a *Watcher).
type PodSource interface {
	Lookup(c Container) (Pod, bool)
}

// Enricher answers the aggregator's question "which pod is this process
// in" from /proc/PID/cgroup and the pod watch.
type Enricher struct {
	Pods     PodSource
	ProcRoot string

	mu         sync.Mutex
	containers map[int]*Container // nil value: not in a pod
}

// Pod returns the labels of pid. done is false while they may still
// change: the pod is not in the watch's cache yet, or its status does not
// list the container yet; the aggregator asks again on the next drain, so
// a process seen before its pod is labelled as soon as the pod arrives.
// A process that is in no pod is done at once, with empty labels.
func (e *Enricher) Pod(pid int) (namespace, pod, container string, done bool) {
	c := e.container(pid)
	if c == nil {
		return "", "", "", true
	}
	p, ok := e.Pods.Lookup(*c)
	if !ok {
		return "", "", "", false
	}
	name, ok := p.Containers[c.ID]
	return p.Namespace, p.Name, name, ok
}

// FullMode reports whether pid's pod is annotated profi/mode: full. It is
// false while the pod is unknown and turns true once the watch has it.
func (e *Enricher) FullMode(pid int) bool {
	c := e.container(pid)
	if c == nil {
		return false
	}
	p, ok := e.Pods.Lookup(*c)
	return ok && p.FullMode
}

// container parses the process's cgroup once.
func (e *Enricher) container(pid int) *Container {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.containers == nil {
		e.containers = map[int]*Container{}
	}
	if c, ok := e.containers[pid]; ok {
		return c
	}
	root := e.ProcRoot
	if root == "" {
		root = "/proc"
	}
	var out *Container
	if b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "cgroup")); err == nil {
		if c, ok := ParseCgroup(b); ok {
			out = &c
		}
	}
	e.containers[pid] = out
	return out
}

// Forget drops what is known about an exited process.
func (e *Enricher) Forget(pid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.containers, pid)
}
