package k8s

import (
	"context"
	"encoding/json"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Client is the agent's Kubernetes client: one REST client per API group
// it uses (pods list and watch, TokenReview, SubjectAccessReview,
// SelfSubjectAccessReview, the server's version), over one HTTP client,
// with a scheme of those three groups alone. client-go's clientset and
// informer factory register every API group there is (56 packages of
// types, their typed clients and apply configurations): most of the
// Kubernetes code in the binary, for four resources (issue 44, "a
// lighter agent"; docs/BENCHMARK.md).
type Client struct {
	core, authn, authz rest.Interface
}

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(authenticationv1.AddToScheme(scheme))
	utilruntime.Must(authorizationv1.AddToScheme(scheme))
}

// NewClient returns a Client for rc.
func NewClient(rc *rest.Config) (*Client, error) {
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes HTTP client: %w", err)
	}
	group := func(apiPath string, gv schema.GroupVersion) (rest.Interface, error) {
		c := rest.CopyConfig(rc)
		c.APIPath, c.GroupVersion = apiPath, &gv
		c.NegotiatedSerializer = codecs.WithoutConversion()
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientForConfigAndClient(c, hc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client for %s: %w", gv, err)
		}
		return rc, nil
	}
	var c Client
	if c.core, err = group("/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if c.authn, err = group("/apis", authenticationv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if c.authz, err = group("/apis", authorizationv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	return &c, nil
}

// Pods lists and watches the pods with spec.nodeName == node (NewWatcher).
func (c *Client) Pods(node string) cache.ListerWatcher {
	return cache.NewFilteredListWatchFromClient(c.core, "pods", metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	})
}

// ServerVersion is the API server's /version.
func (c *Client) ServerVersion(ctx context.Context) (*version.Info, error) {
	body, err := c.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, fmt.Errorf("get /version: %w", err)
	}
	var v version.Info
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("decode /version: %w", err)
	}
	return &v, nil
}

// Creator creates one kind of review, as client-go's typed clients do
// (their TokenReviewInterface and SubjectAccessReviewInterface satisfy
// it, so tests may pass those).
type Creator[T runtime.Object] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
}

// creator posts objects of one resource and decodes the answer into a
// new T.
type creator[T runtime.Object] struct {
	c        rest.Interface
	resource string
	empty    func() T
}

func (r creator[T]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := r.empty()
	err := r.c.Post().Resource(r.resource).VersionedParams(&opts, metav1.ParameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// TokenReviews creates TokenReviews (bearer authentication).
func (c *Client) TokenReviews() Creator[*authenticationv1.TokenReview] {
	return creator[*authenticationv1.TokenReview]{c.authn, "tokenreviews", func() *authenticationv1.TokenReview { return &authenticationv1.TokenReview{} }}
}

// SubjectAccessReviews creates SubjectAccessReviews (--metrics-auth-authorize).
func (c *Client) SubjectAccessReviews() Creator[*authorizationv1.SubjectAccessReview] {
	return creator[*authorizationv1.SubjectAccessReview]{c.authz, "subjectaccessreviews", func() *authorizationv1.SubjectAccessReview { return &authorizationv1.SubjectAccessReview{} }}
}

// SelfSubjectAccessReviews creates SelfSubjectAccessReviews (profi check).
func (c *Client) SelfSubjectAccessReviews() Creator[*authorizationv1.SelfSubjectAccessReview] {
	return creator[*authorizationv1.SelfSubjectAccessReview]{c.authz, "selfsubjectaccessreviews", func() *authorizationv1.SelfSubjectAccessReview {
		return &authorizationv1.SelfSubjectAccessReview{}
	}}
}
