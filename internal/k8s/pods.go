package k8s

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/profi-dev/profi/internal/status"
)

const uidIndex = "uid"

// ModeAnnotation set to "full" on a pod upgrades its processes to full
// kernel mode (docs/INTERFACE.md: the profi/mode annotation).
const ModeAnnotation = "profi/mode"

// Pod is what profi keeps of a pod: enough to label its processes.
type Pod struct {
	Namespace, Name string
	// Containers maps container IDs (no runtime prefix) to container
	// names, over containers, init containers and ephemeral containers.
	Containers map[string]string
	// FullMode is the pod's profi/mode: full annotation: its processes get
	// full kernel mode whatever --kernel-mode says.
	FullMode bool
}

// Status is the pod watch state for /status.
type Status = status.Kubernetes

// Watcher keeps a client-go informer of the pods scheduled on one node.
// The informer lists, watches, and on any error re-lists with backoff; its
// errors are counted and kept for /status, never fatal.
type Watcher struct {
	node     string
	log      *slog.Logger
	informer cache.SharedIndexInformer
	synced   atomic.Bool
	errors   atomic.Uint64
	mu       sync.Mutex
	lastErr  string
	lastAt   time.Time
}

// NewWatcher prepares a watch of the pods lw lists and watches: those
// with spec.nodeName == node (Client.Pods).
func NewWatcher(lw cache.ListerWatcher, node string, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	w := &Watcher{node: node, log: log.With("component", "k8s")}
	w.informer = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}})
	// Keep only what labels need: a node can run hundreds of pods.
	if err := w.informer.SetTransform(slim); err != nil {
		return nil, fmt.Errorf("pod informer transform: %w", err)
	}
	if err := w.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		w.errors.Add(1)
		w.mu.Lock()
		w.lastErr, w.lastAt = err.Error(), time.Now()
		w.mu.Unlock()
		w.log.Warn("pod watch failed; retrying", "node", node, "err", err)
	}); err != nil {
		return nil, fmt.Errorf("pod informer error handler: %w", err)
	}
	return w, nil
}

// slim turns a *corev1.Pod into the few fields profi keeps.
func slim(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // tombstones pass through
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}}
	if v, ok := p.Annotations[ModeAnnotation]; ok {
		out.Annotations = map[string]string{ModeAnnotation: v} // the only annotation read
	}
	keep := func(in []corev1.ContainerStatus) []corev1.ContainerStatus {
		res := make([]corev1.ContainerStatus, 0, len(in))
		for _, s := range in {
			res = append(res, corev1.ContainerStatus{Name: s.Name, ContainerID: s.ContainerID})
		}
		return res
	}
	out.Status.ContainerStatuses = keep(p.Status.ContainerStatuses)
	out.Status.InitContainerStatuses = keep(p.Status.InitContainerStatuses)
	out.Status.EphemeralContainerStatuses = keep(p.Status.EphemeralContainerStatuses)
	return out, nil
}

// Run starts the informer and blocks until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.informer.RunWithContext(ctx)
	}()
	if cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		w.synced.Store(true)
		w.log.Info("pod watch synced", "node", w.node, "pods", len(w.informer.GetStore().ListKeys()))
	}
	<-done
	return nil
}

// Synced reports whether the initial list has completed (for /ready).
func (w *Watcher) Synced() bool { return w.synced.Load() }

// Status returns the watch state.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Status{NodeName: w.node, Synced: w.Synced(), Pods: len(w.informer.GetStore().ListKeys()),
		WatchErrors: w.errors.Load(), LastError: w.lastErr, LastErrorAt: w.lastAt}
}

// Lookup returns the pod with this UID and the name of the container
// with this ID ("" while the pod's status does not list it yet).
func (w *Watcher) Lookup(c Container) (Pod, bool) {
	objs, err := w.informer.GetIndexer().ByIndex(uidIndex, c.PodUID)
	if err != nil || len(objs) == 0 {
		return Pod{}, false
	}
	p, ok := objs[0].(*corev1.Pod)
	if !ok {
		return Pod{}, false
	}
	out := Pod{Namespace: p.Namespace, Name: p.Name, Containers: map[string]string{},
		FullMode: p.Annotations[ModeAnnotation] == "full"}
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, s := range list {
			if s.ContainerID != "" {
				out.Containers[TrimRuntime(s.ContainerID)] = s.Name
			}
		}
	}
	return out, true
}
