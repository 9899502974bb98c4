package check

import (
	"context"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/k8s"
)

// kubernetesChecks runs when the agent will talk to the API server: pod
// enrichment (--node-name) or bearer authentication (TokenReview).
func kubernetesChecks(ctx context.Context, env *Env) []Result {
	cfg := env.Config
	bearer := cfg.MetricsAuth.Mode == config.AuthModeBearer || cfg.MetricsAuth.Mode == config.AuthModeMTLSOrBearer
	if cfg.NodeName == "" && !bearer {
		return []Result{{Name: "kubernetes", Status: OK, Detail: "not used: no --node-name / NODE_NAME (no pod labels) and no bearer auth"}}
	}
	var rc *rest.Config
	var err error
	source := "in-cluster service account"
	if path := env.Getenv("KUBECONFIG"); path != "" {
		source = "KUBECONFIG " + path
		rc, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return []Result{{Name: "kubernetes", Status: Fail, Detail: "no credentials (" + source + "): " + err.Error(),
			Fix: "run in a pod with a service account token (automountServiceAccountToken: true), or set KUBECONFIG outside a cluster"}}
	}
	rc.Timeout = env.Timeout
	client, err := k8s.NewClient(rc)
	if err != nil {
		return []Result{{Name: "kubernetes", Status: Fail, Detail: "client: " + err.Error(), Fix: "correct the kubeconfig"}}
	}
	v, err := client.ServerVersion(ctx)
	if err != nil {
		return []Result{{Name: "kubernetes", Status: Fail, Detail: fmt.Sprintf("API server %s (%s) unreachable: %v", rc.Host, source, err),
			Fix: "check that the API server is up and reachable from the node (network policy, KUBERNETES_SERVICE_HOST, firewall); without it pods get no labels and /ready stays false"}}
	}
	out := []Result{{Name: "kubernetes", Status: OK, Detail: fmt.Sprintf("API server %s (%s) reachable, version %s", rc.Host, source, v.GitVersion)}}
	var want []authorizationv1.ResourceAttributes
	if cfg.NodeName != "" {
		want = append(want,
			authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods"},
			authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"})
	}
	if bearer {
		want = append(want, authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"})
	}
	var denied, allowed []string
	for _, ra := range want {
		name := ra.Verb + " " + ra.Resource
		if ra.Group != "" {
			name += "." + ra.Group
		}
		ssar, err := client.SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra},
		}, metav1.CreateOptions{})
		switch {
		case err != nil:
			denied = append(denied, fmt.Sprintf("%s (review failed: %v)", name, err))
		case !ssar.Status.Allowed:
			denied = append(denied, name)
		default:
			allowed = append(allowed, name)
		}
	}
	if len(denied) > 0 {
		out = append(out, Result{Name: "kubernetes_rbac", Status: Fail, Detail: "the agent may not " + strings.Join(denied, ", "),
			Fix: "bind the agent's service account to a ClusterRole with pods get/list/watch (and tokenreviews create for bearer auth); the chart's rbac.create does"})
	} else {
		out = append(out, Result{Name: "kubernetes_rbac", Status: OK, Detail: "allowed: " + strings.Join(allowed, ", ")})
	}
	return out
}
