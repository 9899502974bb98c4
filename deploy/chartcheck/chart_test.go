package chartcheck

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/testutil/kubetest"
	"github.com/profi-dev/profi/internal/testutil/testenv"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// TestDryRunOnAPIServer applies every rendered manifest of every values set
// with server-side dry-run and field validation Strict to a real
// kube-apiserver with the chart's CRDs loaded: the API server's own schema
// validation and admission accept each object, and an unknown field is an
// error, not silently pruned. A control object with a misspelled field must
// be rejected, proving the validation is in effect for each CRD.
func TestDryRunOnAPIServer(t *testing.T) {
	sets := valueSets(t)
	rendered := map[string][]*unstructured.Unstructured{}
	for _, name := range sortedKeys(sets) {
		rendered[name] = render(t, sets[name])
	}
	srv := kubetest.StartAPIServer(t)
	cfg := srv.RESTConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	crds, err := kubetest.CRDFiles()
	if err != nil || len(crds) != 3 {
		t.Fatalf("CRD files: %v %v, want 3", crds, err)
	}
	srv.InstallCRDs(t, crds...)
	if _, err := srv.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mapper *restmapper.DeferredDiscoveryRESTMapper
	_ = mapper
	var groups []*restmapper.APIGroupResources
	if err := testenv.Eventually(time.Minute, func() error {
		groups, err = restmapper.GetAPIGroupResources(dc)
		if err != nil {
			return err
		}
		for _, g := range []string{"monitoring.coreos.com", "cert-manager.io"} {
			if !slices.ContainsFunc(groups, func(r *restmapper.APIGroupResources) bool { return r.Group.Name == g }) {
				return fmt.Errorf("group %s not served yet", g)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rm := restmapper.NewDiscoveryRESTMapper(groups)

	apply := func(o *unstructured.Unstructured) error {
		gvk := o.GroupVersionKind()
		m, err := rm.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s: %w", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		_, err = ri.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		return err
	}

	for _, name := range sortedKeys(rendered) {
		kinds := map[string]int{}
		for _, o := range rendered[name] {
			kinds[o.GetKind()]++
			if err := apply(o); err != nil {
				t.Errorf("values %s: server-side dry-run of %s %s: %v", name, o.GetKind(), o.GetName(), err)
			}
		}
		t.Logf("values %s: %d objects accepted by kube-apiserver %s (dry-run, strict): %v", name, len(rendered[name]), kubeVersion, kinds)
	}

	// Controls: a misspelled field in each kind is rejected.
	for _, kind := range []string{"DaemonSet", "ServiceMonitor", "PrometheusRule", "Certificate"} {
		var src *unstructured.Unstructured
		for _, name := range sortedKeys(rendered) {
			if f := find(rendered[name], kind); len(f) > 0 {
				src = f[0]
				break
			}
		}
		if src == nil {
			t.Errorf("no rendered %s to use as control", kind)
			continue
		}
		bad := src.DeepCopy()
		if err := unstructured.SetNestedField(bad.Object, "x", "spec", "notAField"); err != nil {
			t.Fatal(err)
		}
		err := apply(bad)
		if err == nil || !apierrors.IsBadRequest(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "notAField") {
			t.Errorf("%s with spec.notAField: err = %v, want a strict field validation error naming it", kind, err)
		}
	}
}

// agentArgs returns the profi container's args and its security context.
func agentContainer(t *testing.T, objs []*unstructured.Unstructured) (*corev1.PodSpec, corev1.Container) {
	t.Helper()
	ds := one(t, objs, "DaemonSet")
	var spec corev1.PodSpec
	raw, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(raw, &spec, true); err != nil {
		t.Fatalf("DaemonSet pod spec: %v", err)
	}
	for _, c := range spec.Containers {
		if c.Name == "profi" {
			return &spec, c
		}
	}
	t.Fatal("no container profi")
	return nil, corev1.Container{}
}

// TestAgentArgsParse feeds the rendered agent arguments of every values set
// to the agent's own flag parser (internal/config): the chart passes only
// flags the agent knows, in forms it accepts, and the values files together
// reach every flag of the agent except those the chart sets otherwise.
func TestAgentArgsParse(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "internal/config/config.go"))
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]bool{}
	for _, m := range regexp.MustCompile("`name:\"([a-z0-9-]+)\"").FindAllStringSubmatch(string(src), -1) {
		all[m[1]] = true
	}
	// Flags the chart does not pass, and why.
	notPassed := map[string]string{
		"help":            "prints help",
		"version":         "prints the version",
		"pid":             "a DaemonSet watches every process of its node",
		"node-name":       "set through NODE_NAME from spec.nodeName",
		"log-level":       "profi.logLevel sets RUST_LOG (docs/INTERFACE.md section 7); extraArgs can pass it",
		"no-uprobe-multi": "a test switch (forces classic uprobes for NCCL); extraArgs can pass it",
		"kmsg-trust-user": "a test switch (kernel-log lines from userspace count as the kernel's); never for production",
		"assume-kernel":   "a test switch (the kernel the bug table classifies); never for production",
	}
	seen := map[string]bool{}
	sets := valueSets(t)
	for _, name := range sortedKeys(sets) {
		spec, c := agentContainer(t, render(t, sets[name]))
		getenv := func(k string) string {
			for _, e := range c.Env {
				if e.Name == k {
					return e.Value
				}
			}
			return ""
		}
		if _, _, err := config.Parse(c.Args, getenv); err != nil {
			t.Errorf("values %s: the agent rejects the chart's arguments %q: %v", name, c.Args, err)
		}
		for _, a := range c.Args {
			f := strings.SplitN(strings.TrimPrefix(a, "--"), "=", 2)[0]
			if !all[f] {
				t.Errorf("values %s: argument %q is not a flag of internal/config", name, a)
			}
			seen[f] = true
		}
		// The init container runs `profi check` with the same arguments.
		for _, ic := range spec.InitContainers {
			if ic.Name == "check" && !slices.Equal(ic.Args, append([]string{"check"}, c.Args...)) {
				t.Errorf("values %s: init container args %q, want check + the agent's", name, ic.Args)
			}
		}
	}
	for f := range all {
		if _, ok := notPassed[f]; !ok && !seen[f] {
			t.Errorf("flag --%s is reached by no values file: add a values key (docs/INTERFACE.md section 7) and set it in deploy/profi/ci", f)
		}
	}
}

// TestDaemonSetPrivileges pins the privileges of the agent (the Rust
// exporter's chart ran it privileged; docs/SECURITY.md): host PID namespace, root without privilege escalation, only BPF,
// PERFMON, SYS_PTRACE and SYSLOG (SYSLOG only with the kernel log on,
// SYS_ADMIN only with the overhead budget), a
// read-only root filesystem, seccompProfile RuntimeDefault, the host's /proc
// read-only, and no hostPath other than /proc (no debugfs, tracefs or bpffs).
func TestDaemonSetPrivileges(t *testing.T) {
	sets := valueSets(t)
	for _, name := range sortedKeys(sets) {
		objs := render(t, sets[name])
		spec, c := agentContainer(t, objs)
		if !spec.HostPID {
			t.Errorf("values %s: hostPID is false", name)
		}
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil {
			t.Fatalf("values %s: no securityContext.capabilities", name)
		}
		var add []string
		for _, cp := range sc.Capabilities.Add {
			add = append(add, string(cp))
		}
		want := []string{"BPF", "PERFMON", "SYS_PTRACE"}
		if !slices.Contains(c.Args, "--kernel-log=off") {
			want = append(want, "SYSLOG") // syslog(2)
		}
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--overhead-budget=") && a != "--overhead-budget=0" }) {
			want = append(want, "SYS_ADMIN") // BPF_ENABLE_STATS
		}
		if !slices.Equal(add, want) {
			t.Errorf("values %s: capabilities add %v, want %v", name, add, want)
		}
		if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("values %s: capabilities drop %v, want [ALL]", name, sc.Capabilities.Drop)
		}
		if sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("values %s: securityContext %+v: want privileged false, allowPrivilegeEscalation false, readOnlyRootFilesystem true", name, sc)
		}
		// The runtime's default seccomp profile, for the init container too
		// (test/e2e/image_test.go runs both under it).
		for _, cc := range append([]corev1.Container{c}, spec.InitContainers...) {
			if p := cc.SecurityContext.SeccompProfile; p == nil || p.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("values %s: container %s seccompProfile %+v, want RuntimeDefault", name, cc.Name, p)
			}
		}
		for _, v := range spec.Volumes {
			if v.HostPath != nil && v.HostPath.Path != "/proc" {
				t.Errorf("values %s: hostPath volume %s at %s: only /proc is needed", name, v.Name, v.HostPath.Path)
			}
		}
		for _, m := range c.VolumeMounts {
			if m.Name == "host-proc" && (!m.ReadOnly || m.MountPath != "/host/proc" || m.SubPath != "") {
				t.Errorf("values %s: host /proc mount %+v, want read-only at /host/proc", name, m)
			}
			if m.Name == "metrics-tls" && m.SubPath != "" {
				t.Errorf("values %s: TLS secret mounted with subPath: renewals would never reach the agent", name)
			}
		}
		if !slices.Contains(c.Args, "--proc-path=/host/proc") {
			t.Errorf("values %s: args %q lack --proc-path=/host/proc", name, c.Args)
		}
		wantScheme := corev1.URISchemeHTTP
		if name != "default" {
			wantScheme = corev1.URISchemeHTTPS
		}
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != wantScheme {
				t.Errorf("values %s: probe %+v, want httpGet over %s", name, p, wantScheme)
			}
		}
		// RBAC: pods list/watch always; tokenreviews create only with auth;
		// subjectaccessreviews with metricsAuth.authorize (on by default),
		// and then the reader ClusterRole, bound to profi.metricsAuth.readers.
		roles := map[string][]string{}
		for _, role := range find(objs, "ClusterRole") {
			rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
			for _, r := range rules {
				m := r.(map[string]any)
				roles[role.GetName()] = append(roles[role.GetName()], fmt.Sprint(m["apiGroups"], m["resources"], m["nonResourceURLs"], m["verbs"]))
			}
		}
		wantRoles := map[string][]string{releaseName: {"[] [pods] <nil> [list watch]"}}
		if name != "default" {
			wantRoles[releaseName] = append(wantRoles[releaseName], "[authentication.k8s.io] [tokenreviews] <nil> [create]",
				"[authorization.k8s.io] [subjectaccessreviews] <nil> [create]")
			wantRoles[releaseName+"-metrics-reader"] = []string{"<nil> <nil> [/metrics] [get]"}
		}
		if !maps.EqualFunc(roles, wantRoles, slices.Equal) {
			t.Errorf("values %s: ClusterRole rules %q, want %q", name, roles, wantRoles)
		}
		var readers []string
		for _, b := range find(objs, "ClusterRoleBinding") {
			if ref, _, _ := unstructured.NestedString(b.Object, "roleRef", "name"); ref == releaseName+"-metrics-reader" {
				subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
				for _, sub := range subjects {
					m := sub.(map[string]any)
					readers = append(readers, fmt.Sprint(m["kind"], "/", m["namespace"], "/", m["name"]))
				}
			}
		}
		wantReaders := []string(nil)
		if strings.HasPrefix(name, "tls-auth-otlp") { // metricsAuth.readers
			wantReaders = []string{"ServiceAccount/monitoring/prometheus"}
		}
		if !slices.Equal(readers, wantReaders) {
			t.Errorf("values %s: metrics readers %q, want %q", name, readers, wantReaders)
		}
	}
}

// TestNotesUseNoToolInImage: NOTES.txt must not tell users to run wget or
// curl inside the container (the image has neither).
func TestNotesUseNoToolInImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy/profi/templates/NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"wget", "kubectl exec", "kubectl -n {{ .Release.Namespace }} exec"} {
		if strings.Contains(string(b), bad) {
			t.Errorf("NOTES.txt uses %q", bad)
		}
	}
}

// TestChartRefusesInsecureAuth: value combinations that would weaken the
// agent's authentication fail `helm template` with a message saying why
// (issue 17 item 5), and the serving certificate is issued for server auth
// only, in every TLS mode: it is no client credential.
func TestChartRefusesInsecureAuth(t *testing.T) {
	helm := requireHelm(t)
	chart := filepath.Join(repoRoot(t), "deploy/profi")
	cm := []string{"profi.metricsTls.certManager.enabled=true", "profi.metricsTls.certManager.issuerName=ca"}
	cases := []struct {
		name string
		set  []string
		fail string // "" = renders
	}{
		{"bearer over plain HTTP", []string{"profi.metricsAuth.mode=bearer"}, "bearer over plain HTTP"},
		{"bearer over HTTPS", append([]string{"profi.metricsAuth.mode=bearer", "profi.metricsTls.mode=server"}, cm...), ""},
		{"client SANs without mtls", append([]string{"profi.metricsTls.mode=server", "profi.metricsTls.allowedClientSANs[0]=p"}, cm...), "allowedClientSANs needs profi.metricsTls.mode mtls"},
		{"client SANs with mtls", append([]string{"profi.metricsTls.mode=mtls", "profi.metricsTls.allowedClientSANs[0]=p"}, cm...), ""},
	}
	for _, tc := range cases {
		args := templateArgs(chart)
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := exec.Command(helm, args...).CombinedOutput()
		switch {
		case tc.fail == "" && err != nil:
			t.Errorf("%s: helm template failed: %v\n%s", tc.name, err, out)
		case tc.fail != "" && (err == nil || !strings.Contains(string(out), tc.fail)):
			t.Errorf("%s: helm template %v, want a failure saying %q:\n%s", tc.name, err, tc.fail, out)
		case tc.fail == "":
			objs, err := decodeManifests(out)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			for _, c := range find(objs, "Certificate") {
				if c.GetName() != releaseName+"-metrics-tls" {
					continue
				}
				usages, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "usages")
				if want := []string{"digital signature", "key encipherment", "server auth"}; !slices.Equal(usages, want) {
					t.Errorf("%s: serving certificate usages %q, want %q", tc.name, usages, want)
				}
			}
		}
	}
}

// TestNetworkPolicy: off by default; on, it selects exactly the agent's
// pods, admits only the configured peers and only to the metrics port, and
// restricts ingress only. A policy without peers (which would admit every
// source) fails the install.
func TestNetworkPolicy(t *testing.T) {
	sets := valueSets(t)
	for _, name := range sortedKeys(sets) {
		objs := render(t, sets[name])
		policies := find(objs, "NetworkPolicy")
		if name != "tls-auth-otlp-values" {
			if len(policies) != 0 {
				t.Errorf("values %s: %d NetworkPolicies, want none (networkPolicy.enabled defaults to false)", name, len(policies))
			}
			continue
		}
		if len(policies) != 1 {
			t.Fatalf("values %s: %d NetworkPolicies, want 1", name, len(policies))
		}
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(policies[0].Object, &np, true); err != nil {
			t.Fatalf("values %s: NetworkPolicy: %v", name, err)
		}
		_, c := agentContainer(t, objs)
		ds := one(t, objs, "DaemonSet")
		podLabels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(podLabels)) || len(np.Spec.PodSelector.MatchLabels) == 0 {
			t.Errorf("values %s: podSelector %+v does not select the agent's pods %v (%v)", name, np.Spec.PodSelector, podLabels, err)
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Egress) != 0 {
			t.Errorf("values %s: policyTypes %v, egress %v: want Ingress only", name, np.Spec.PolicyTypes, np.Spec.Egress)
		}
		if len(np.Spec.Ingress) != 1 {
			t.Fatalf("values %s: %d ingress rules, want 1", name, len(np.Spec.Ingress))
		}
		rule := np.Spec.Ingress[0]
		var metricsPort int32
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				metricsPort = p.ContainerPort
			}
		}
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.IntVal != metricsPort || metricsPort == 0 ||
			rule.Ports[0].Protocol == nil || *rule.Ports[0].Protocol != corev1.ProtocolTCP {
			t.Errorf("values %s: ingress ports %+v, want TCP %d only", name, rule.Ports, metricsPort)
		}
		if want := valuesPeers(t, sets[name]); !reflect.DeepEqual(rule.From, want) {
			t.Errorf("values %s: ingress from %+v, want the values file's peers %+v", name, rule.From, want)
		}
	}

	helm := requireHelm(t)
	chart := filepath.Join(repoRoot(t), "deploy/profi")
	out, err := exec.Command(helm, "template", releaseName, chart, "--namespace", namespace, "--kube-version", kubeVersion,
		"--set", "networkPolicy.enabled=true", "--set-json", "networkPolicy.from=[]").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "networkPolicy.from is empty") {
		t.Errorf("networkPolicy without peers: helm template %v, want a failure saying networkPolicy.from is empty:\n%s", err, out)
	}
	out, err = exec.Command(helm, "template", releaseName, chart, "--namespace", namespace, "--kube-version", kubeVersion,
		"--set", "networkPolicy.enabled=true", "--show-only", "templates/networkpolicy.yaml").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kubernetes.io/metadata.name: monitoring") {
		t.Errorf("networkPolicy with the default peers: helm template %v:\n%s", err, out)
	}
}

// valuesPeers decodes networkPolicy.from of a values file.
func valuesPeers(t *testing.T, file string) []networkingv1.NetworkPolicyPeer {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var values map[string]any
	if err := yamlutil.NewYAMLOrJSONDecoder(f, 4096).Decode(&values); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	raw, _, err := unstructured.NestedSlice(values, "networkPolicy", "from")
	if err != nil || len(raw) == 0 {
		t.Fatalf("%s: no networkPolicy.from (%v)", file, err)
	}
	peers := make([]networkingv1.NetworkPolicyPeer, len(raw))
	for i, r := range raw {
		m, _ := r.(map[string]any)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m, &peers[i], true); err != nil {
			t.Fatalf("%s: networkPolicy.from[%d]: %v", file, i, err)
		}
	}
	return peers
}

// TestMonitoringObjectsNeedTheirAPI: on a cluster that does not serve the
// Prometheus Operator's kinds, the defaults render neither the
// ServiceMonitor nor the PrometheusRule, so `helm install` with the
// defaults works there (issue 48; test/e2e/node_test.go installs it so);
// where the API is served, both are rendered.
func TestMonitoringObjectsNeedTheirAPI(t *testing.T) {
	helm := requireHelm(t)
	chart := filepath.Join(repoRoot(t), "deploy/profi")
	kinds := func(args []string) map[string]bool {
		out, err := exec.Command(helm, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
		objs, err := decodeManifests(out)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, o := range objs {
			got[o.GetKind()] = true
		}
		return got
	}
	without := kinds([]string{"template", releaseName, chart, "--namespace", namespace, "--kube-version", kubeVersion})
	if without["ServiceMonitor"] || without["PrometheusRule"] || !without["DaemonSet"] {
		t.Errorf("without the monitoring.coreos.com/v1 API: kinds %v, want a DaemonSet and no ServiceMonitor or PrometheusRule", without)
	}
	with := kinds(templateArgs(chart))
	if !with["ServiceMonitor"] || !with["PrometheusRule"] {
		t.Errorf("with the monitoring.coreos.com/v1 API: kinds %v, want a ServiceMonitor and a PrometheusRule", with)
	}
}
