#!/usr/bin/env bash
# Builds Kubernetes binaries for the tests from the k8s.io/kubernetes Go
# module, via the wrapper module tools/kube, and prints their paths, one a
# line:
#   kube-apiserver           the API server of every Kubernetes test
#                            (internal/testutil/kubetest/apiserver.go)
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy
#                            the single-node cluster the chart is installed
#                            on (internal/testutil/kubetest/node.go)
#
# Each binary is cached outside the repository, keyed by version:
#   ${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/NAME-VERSION/NAME
# so only a new machine pays the build (kube-apiserver about 5-10 minutes on 2
# cores, the four node binaries about 5 more, one go build sharing their
# packages); when they are there the script only prints their paths. With
# --check it builds nothing and exits 1 when one is missing. Safe to run
# concurrently: a lock serialises builds and each binary appears atomically.
#
# Usage: scripts/build-kube.sh [--check] NAME...   (no NAME: all five)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
wrapper=$repo/tools/kube

check=false
if [ "${1:-}" = --check ]; then
	check=true
	shift
fi
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy)
for n in "${names[@]}"; do
	grep -q "k8s.io/kubernetes/cmd/$n\$" "$wrapper/go.mod" ||
		{ echo "build-kube: $n is not a tool of $wrapper/go.mod" >&2; exit 2; }
done

# The version is the one the wrapper module requires.
version=$(awk '$1 == "k8s.io/kubernetes" {v = $2} END {print v}' "$wrapper/go.mod")
if [[ ! $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]]; then
	echo "build-kube: $wrapper/go.mod requires k8s.io/kubernetes '$version', not vX.Y.Z" >&2
	exit 1
fi
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}

cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}
binpath() { echo "$cache/$1-$version/$1"; }
missing() {
	local n
	for n in "${names[@]}"; do
		[ -x "$(binpath "$n")" ] || echo "$n"
	done
}
report() {
	local n
	for n in "${names[@]}"; do binpath "$n"; done
}

todo=$(missing)
[ -z "$todo" ] && { report; exit 0; }
$check && exit 1 # not built: say so, build nothing

mkdir -p "$cache"
exec 9>"$cache/.kube-build.lock"
flock 9
todo=$(missing) # some may have been built by whoever held the lock
[ -z "$todo" ] && { report; exit 0; }

# The same version variables as Kubernetes' own builds (hack/lib/version.sh):
# the binaries derive their binary and emulation versions from gitVersion.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

pkgs=()
for n in $todo; do pkgs+=("k8s.io/kubernetes/cmd/$n"); done
echo "build-kube: building $(echo $todo) $version into $cache (several minutes on 2 cores)" >&2
start=$(date +%s)
out=$(mktemp -d "$cache/.kube-build.XXXXXX")
trap 'rm -rf "$out"' EXIT
(
	cd "$wrapper"
	# One go build for all of them: they share most packages.
	GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly \
		go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}"
)
for n in $todo; do
	"$out/$n" --version >&2
	mkdir -p "$(dirname "$(binpath "$n")")"
	mv -f "$out/$n" "$(binpath "$n")"
done
echo "build-kube: built in $(($(date +%s) - start))s" >&2
report
