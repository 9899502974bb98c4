package chartcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
)

const (
	// kubeVersion given to helm template (the chart needs >= 1.24; a go-installed
	// helm defaults to 1.20). The version of the test API server.
	kubeVersion = "1.37.2"
	releaseName = "profi"
	namespace   = "monitoring"
)

// templateArgs are helm template's arguments for the release, with the
// Prometheus Operator's kinds among the API versions (its CRDs are loaded
// for the dry-run): without them the chart leaves the ServiceMonitor and
// PrometheusRule out (TestMonitoringObjectsNeedTheirAPI).
func templateArgs(chart string, extra ...string) []string {
	return append([]string{"template", releaseName, chart, "--namespace", namespace,
		"--kube-version", kubeVersion, "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule"}, extra...)
}

// requireTool returns the path of a tool, or skips the test (fails it with
// PROFI_E2E=1) with how to get it.
func requireTool(t *testing.T, path string, err error, how string) string {
	t.Helper()
	if err == nil {
		return path
	}
	if os.Getenv(testenv.E2EEnv) == "1" {
		t.Fatalf("%v (%s) and %s=1 forbids skipping", err, how, testenv.E2EEnv)
	}
	t.Skipf("skipping: %v (%s; set %s=1 to make this a failure)", err, how, testenv.E2EEnv)
	return ""
}

func requireHelm(t *testing.T) string {
	t.Helper()
	p, err := kubetest.HelmBinary()
	return requireTool(t, p, err, "run scripts/build-helm.sh, about 6 minutes, or set "+kubetest.HelmEnv)
}

func requirePromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	return requireTool(t, p, err, "Debian package prometheus")
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// valueSets are the values files rendered and checked: "default" (none) and
// every deploy/profi/ci/*.yaml.
func valueSets(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy/profi/ci/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no values files in deploy/profi/ci")
	}
	sets := map[string]string{"default": ""}
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), ".yaml")] = f
	}
	return sets
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var (
	renderMu    sync.Mutex
	renderCache = map[string][]*unstructured.Unstructured{}
)

// render runs helm lint --strict and helm template with a values file (""
// for the defaults) and returns the manifests, cached per values file.
func render(t *testing.T, values string) []*unstructured.Unstructured {
	t.Helper()
	renderMu.Lock()
	defer renderMu.Unlock()
	if objs, ok := renderCache[values]; ok {
		return objs
	}
	helm := requireHelm(t)
	chart := filepath.Join(repoRoot(t), "deploy/profi")
	var extra []string
	if values != "" {
		extra = []string{"-f", values}
	}
	lint := exec.Command(helm, append([]string{"lint", "--strict", chart, "--kube-version", kubeVersion}, extra...)...)
	if out, err := lint.CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict %v: %v\n%s", extra, err, out)
	}
	args := templateArgs(chart, extra...)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template %v: %v\n%s", extra, err, stderr.String())
	}
	objs, err := decodeManifests(stdout.Bytes())
	if err != nil {
		t.Fatalf("helm template %v: %v", extra, err)
	}
	renderCache[values] = objs
	return objs
}

func decodeManifests(b []byte) ([]*unstructured.Unstructured, error) {
	dec := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode manifest %d: %w", len(objs)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the rendered objects of a kind.
func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func one(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	f := find(objs, kind)
	if len(f) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(f), kind)
	}
	return f[0]
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	return unstructured.NestedString(obj, fields...)
}
