package kubetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestAPIServer drives a real kube-apiserver the way the agent's pod
// enrichment will: a pod bound to a node, its status written as a kubelet
// would, listed by node, across a restart of the API server.
func TestAPIServer(t *testing.T) {
	s := StartAPIServer(t)
	ctx := context.Background()
	c := s.Client()

	if v, err := c.Discovery().ServerVersion(); err != nil {
		t.Fatalf("server version: %v", err)
	} else if want, _ := KubeVersion(); v.GitVersion != want {
		t.Errorf("server version %s, want %s", v.GitVersion, want)
	}

	const ns, node = "profi-smoke", "node-a"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Labels: map[string]string{"app": "trainer"}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "example.invalid/trainer:1"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	if pod.Status.Phase != corev1.PodPending {
		t.Errorf("new pod phase %q, want Pending", pod.Status.Phase)
	}
	// A second pod on another node, which the field selector must leave out.
	if _, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec: corev1.PodSpec{
			NodeName:   "node-b",
			Containers: []corev1.Container{{Name: "main", Image: "example.invalid/other:1"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	// What a kubelet writes once the container runs.
	containerID := "containerd://" + strings.Repeat("0123456789abcdef", 4)
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name:        "main",
			Image:       "example.invalid/trainer:1",
			ImageID:     "example.invalid/trainer@sha256:" + strings.Repeat("ab", 32),
			ContainerID: containerID,
			Ready:       true,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		}},
	}
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update pod status: %v", err)
	}

	check := func(c kubernetes.Interface, when string) {
		t.Helper()
		list, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil {
			t.Fatalf("%s: list pods on %s: %v", when, node, err)
		}
		if len(list.Items) != 1 || list.Items[0].Name != "trainer-0" {
			var names []string
			for _, p := range list.Items {
				names = append(names, p.Namespace+"/"+p.Name)
			}
			t.Fatalf("%s: pods on %s: %v, want [%s/trainer-0]", when, node, names, ns)
		}
		p := list.Items[0]
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 ||
			p.Status.ContainerStatuses[0].ContainerID != containerID {
			t.Fatalf("%s: pod status %+v, want Running with container %s", when, p.Status, containerID)
		}
		if p.UID == "" || p.Labels["app"] != "trainer" {
			t.Errorf("%s: pod uid %q labels %v", when, p.UID, p.Labels)
		}
	}
	check(c, "before restart")

	// The kubeconfig file works on its own, as the agent would load it.
	kc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	check(kubernetes.NewForConfigOrDie(kc), "kubeconfig")

	start := time.Now()
	s.Restart(t)
	t.Logf("kube-apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
	check(c, "after restart") // the same client reconnects to the same port
}

// TestAPIServerRBAC checks that RBAC is enforced for a ServiceAccount, as
// for an agent in a pod: forbidden until a ClusterRoleBinding grants it.
func TestAPIServerRBAC(t *testing.T) {
	s := StartAPIServer(t)
	ctx := context.Background()
	admin := s.Client()
	const ns, sa = "profi-system", "profi"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	agent := kubernetes.NewForConfigOrDie(s.ServiceAccountConfig(t, ns, sa))

	list := func() error {
		_, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"})
		return err
	}
	if err := list(); !apierrors.IsForbidden(err) {
		t.Fatalf("list pods without a binding: %v, want Forbidden", err)
	}

	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "profi"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRole: %v", err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "profi"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "profi"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRoleBinding: %v", err)
	}
	// The authorizer sees new bindings through an informer.
	if err := testenv.Eventually(10*time.Second, list); err != nil {
		t.Fatalf("list pods with a binding: %v", err)
	}
	// Granted exactly that: no writes.
	_, err := agent.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("create pod as %s: %v, want Forbidden", sa, err)
	}
}
