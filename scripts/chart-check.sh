#!/usr/bin/env bash
# `make chart-check`: the Helm chart deploy/profi against real tools.
#   1. helm lint --strict and helm template, default values and deploy/profi/ci/*.yaml
#   2. go test ./deploy/chartcheck: server-side dry-run (strict) on a real
#      kube-apiserver with the CRDs loaded, promtool check/test rules, the
#      dashboard validated with grafana-foundation-sdk, every queried metric
#      and label checked against the collectors, metrics documented.
# Helm is built and cached by scripts/build-helm.sh; kube-apiserver by
# scripts/build-kube.sh; promtool and etcd come from Debian.
# PROFI_E2E=1 (as in CI) turns a missing tool into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
helm=${PROFI_HELM:-$(bash scripts/build-helm.sh)}
export PROFI_HELM=$helm
# The Kubernetes version of the test API server (tools/kube/go.mod).
kube=$(awk '$1 == "k8s.io/kubernetes" {v = $2} END {sub(/^v/, "", v); print v}' tools/kube/go.mod)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for values in "" deploy/profi/ci/*.yaml; do
	name=$(basename "${values:-default}" .yaml)
	args=()
	[ -n "$values" ] && args=(-f "$values")
	"$helm" lint --strict deploy/profi --kube-version "$kube" "${args[@]}"
	# As on a cluster with the Prometheus Operator's CRDs: the chart renders
	# the ServiceMonitor and PrometheusRule only where their API is served.
	"$helm" template profi deploy/profi --namespace monitoring --kube-version "$kube" "${args[@]}" \
		--api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule \
		>"$out/$name.yaml"
	echo "chart-check: $name: $(grep -c '^kind:' "$out/$name.yaml") objects rendered"
done

go test -count=1 -v ./deploy/chartcheck/
