package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// CRDFiles are the CustomResourceDefinitions the chart's optional objects
// need (the Prometheus Operator's ServiceMonitor and PrometheusRule,
// cert-manager's Certificate), as published upstream, kept in the
// repository.
func CRDFiles() ([]string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy/chartcheck/testdata/crds/*.yaml"))
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("no CRD files in %s", filepath.Join(root, "deploy/chartcheck/testdata/crds"))
	}
	return files, err
}

// InstallCRDs creates the CustomResourceDefinitions in files (one per
// file) and waits until each is Established.
func (s *APIServer) InstallCRDs(t testing.TB, files ...string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(s.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var obj unstructured.Unstructured
		if err := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&obj.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD %s: %v", filepath.Base(f), err)
		}
		name := obj.GetName()
		if err := testenv.Eventually(time.Minute, func() error {
			got, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not established yet", name)
		}); err != nil {
			t.Fatal(err)
		}
	}
}
