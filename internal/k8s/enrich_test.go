package k8s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// procTree writes /proc/PID/cgroup files.
func procTree(t *testing.T, cgroups map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, content := range cgroups {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		writeStat(t, root, pid, testStart)
	}
	return root
}

// testStart is the start time procTree gives every process.
const testStart = 100

func writeStat(t *testing.T, root, pid string, start uint64) {
	t.Helper()
	line := fmt.Sprintf("%s (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, start)
	if err := os.WriteFile(filepath.Join(root, pid, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakePods is a PodSource of fixed pods, by pod UID.
type fakePods map[string]Pod

func (f fakePods) Lookup(c Container) (Pod, bool) { p, ok := f[c.PodUID]; return p, ok }

// A new process reusing a PID (same PID, another start time) is never
// labelled with the old process's pod, nor upgraded by its annotation,
// even though the old process was never forgotten; FullMode, asked for
// processes that may never make a probed call, leaves the cache empty.
func TestEnricherPIDReuse(t *testing.T) {
	const other = "11111111-2222-3333-4444-555555555555"
	pods := fakePods{
		uid:   {Namespace: "tenant-a", Name: "a-0", FullMode: true, Containers: map[string]string{cid: "main"}},
		other: {Namespace: "tenant-b", Name: "b-0", Containers: map[string]string{cid: "main"}},
	}
	root := procTree(t, map[string]string{"10": "0::/kubepods/burstable/pod" + uid + "/" + cid + "\n"})
	e := &Enricher{Pods: pods, ProcRoot: root}
	if !e.FullMode(10) {
		t.Fatal("tenant-a process not in full mode")
	}
	if n := e.Cached(); n != 0 {
		t.Errorf("FullMode filled the cache: %d entries, want 0", n)
	}
	if ns, p, _, done := e.Pod(10, testStart); !done || ns != "tenant-a" || p != "a-0" {
		t.Fatalf("Pod = %q %q done %v", ns, p, done)
	}
	// PID 10 exits and is reused by a process of tenant-b.
	if err := os.WriteFile(filepath.Join(root, "10", "cgroup"), []byte("0::/kubepods/burstable/pod"+other+"/"+cid+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeStat(t, root, "10", 555)
	if ns, p, _, done := e.Pod(10, 555); !done || ns != "tenant-b" || p != "b-0" {
		t.Errorf("reused PID: Pod = %q %q done %v; want tenant-b b-0", ns, p, done)
	}
	if e.FullMode(10) {
		t.Error("reused PID inherited tenant-a's full mode")
	}
	// The old start time names no process any more: no labels.
	if ns, p, _, done := e.Pod(10, testStart); !done || ns+p != "" {
		t.Errorf("old start time: Pod = %q %q done %v; want empty and done", ns, p, done)
	}
}

func pod(name string, statuses ...corev1.ContainerStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: "gpu-1"},
		Status:     corev1.PodStatus{ContainerStatuses: statuses},
	}
}

// The enricher heals: a process seen before its pod is in the cache (or
// before the pod's status lists its container) gets its labels as soon as
// they are known. Init and ephemeral containers are matched too.
func TestEnricherLabelsWhenThePodArrives(t *testing.T) {
	client := fake.NewClientset()
	w, err := NewWatcher(clientsetPods(client), "gpu-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	waitFor(t, w.Synced)

	other := "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	root := procTree(t, map[string]string{
		"10": "0::/kubepods/burstable/pod" + uid + "/" + cid + "\n",
		"11": "0::/kubepods/burstable/pod" + uid + "/" + other + "\n",
		"12": "0::/user.slice/session-1.scope\n",
	})
	e := &Enricher{Pods: w, ProcRoot: root}
	if ns, p, c, done := e.Pod(12, testStart); done != true || ns+p+c != "" {
		t.Errorf("host process: %q %q %q done %v; want empty and done", ns, p, c, done)
	}
	if _, _, _, done := e.Pod(10, testStart); done {
		t.Fatal("pod not in the cache yet, but done")
	}
	if _, err := client.CoreV1().Pods("ml").Create(ctx, pod("infer-0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := w.Lookup(Container{PodUID: uid}); return ok })
	if ns, p, c, done := e.Pod(10, testStart); done || ns != "ml" || p != "infer-0" || c != "" {
		t.Errorf("pod known, container not yet: %q %q %q done %v", ns, p, c, done)
	}
	upd := pod("infer-0", corev1.ContainerStatus{Name: "server", ContainerID: "containerd://" + cid})
	upd.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debugger", ContainerID: "cri-o://" + other}}
	if _, err := client.CoreV1().Pods("ml").UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, _, _, done := e.Pod(10, testStart); return done })
	if ns, p, c, _ := e.Pod(10, testStart); ns != "ml" || p != "infer-0" || c != "server" {
		t.Errorf("container: %q %q %q; want ml infer-0 server", ns, p, c)
	}
	if _, _, c, done := e.Pod(11, testStart); !done || c != "debugger" {
		t.Errorf("ephemeral container: %q done %v; want debugger", c, done)
	}
	if st := w.Status(); !st.Synced || st.Pods != 1 || st.NodeName != "gpu-1" {
		t.Errorf("status %+v", st)
	}
}

// clientsetPods lists and watches the pods of a fake clientset, as
// Client.Pods does the API server's.
func clientsetPods(client *fake.Clientset) cache.ListerWatcher {
	// The fake says it cannot stream a list through a watch (the
	// reflector's default); the API server can (Client.Pods).
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, client)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
	}
}

// profi/mode: full is read through the watch's transform (the only
// annotation kept) and follows the pod: the literal value "full" only, and
// an annotation removed later downgrades the process again.
func TestEnricherFullModeAnnotation(t *testing.T) {
	client := fake.NewClientset()
	w, err := NewWatcher(clientsetPods(client), "gpu-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	waitFor(t, w.Synced)
	root := procTree(t, map[string]string{
		"10": "0::/kubepods/burstable/pod" + uid + "/" + cid + "\n",
		"12": "0::/user.slice/session-1.scope\n",
	})
	e := &Enricher{Pods: w, ProcRoot: root}
	if e.FullMode(10) || e.FullMode(12) {
		t.Fatal("full mode before the pod is known")
	}
	p := pod("infer-0")
	p.Annotations = map[string]string{ModeAnnotation: "Full", "other": "x"}
	if _, err := client.CoreV1().Pods("ml").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := w.Lookup(Container{PodUID: uid}); return ok })
	if e.FullMode(10) {
		t.Error(`annotation value "Full" upgraded the process; only "full" does`)
	}
	p.Annotations[ModeAnnotation] = "full"
	if _, err := client.CoreV1().Pods("ml").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.FullMode(10) })
	objs, _ := w.informer.GetIndexer().ByIndex(uidIndex, uid)
	if got := objs[0].(*corev1.Pod).Annotations; len(got) != 1 {
		t.Errorf("cached annotations %v; want only %s", got, ModeAnnotation)
	}
	delete(p.Annotations, ModeAnnotation)
	if _, err := client.CoreV1().Pods("ml").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !e.FullMode(10) })
	if e.FullMode(12) {
		t.Error("host process upgraded")
	}
}

// A process that exited before any drain saw it alive is labelled from
// the two cgroup names BPF noted (its leaf and the leaf's parent), in
// each cgroup driver's layout; other paths are no pod's.
func TestEnricherPodOfCgroup(t *testing.T) {
	pods := fakePods{uid: {Namespace: "ml", Name: "infer-0", Containers: map[string]string{cid: "server"}}}
	e := &Enricher{Pods: pods, ProcRoot: t.TempDir()}
	tests := []struct {
		path string
		want [3]string
	}{
		{"/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope", [3]string{"ml", "infer-0", "server"}},
		{"/pod" + uid + "/" + cid, [3]string{"ml", "infer-0", "server"}},
		{"/pod11111111-2222-3333-4444-555555555555/" + cid, [3]string{}}, // not in the watch
		{"/user.slice/session-1.scope", [3]string{}},
		{"//", [3]string{}},
	}
	for _, tc := range tests {
		ns, p, c := e.PodOfCgroup(tc.path)
		if got := [3]string{ns, p, c}; got != tc.want {
			t.Errorf("PodOfCgroup(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}
