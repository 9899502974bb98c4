#!/usr/bin/env bash
# Builds kube-apiserver for the tests that need a real Kubernetes API server
# (internal/testutil/kubetest/apiserver.go) from the k8s.io/kubernetes Go module, via
# the wrapper module tools/kube-apiserver, and prints the binary's path.
#
# The binary is cached outside the repository, keyed by version:
#   ${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/kube-apiserver-VERSION/kube-apiserver
# so only a new machine pays the build (about 10 minutes on 2 cores); when the
# binary is there the script only prints its path. With --check it builds
# nothing and exits 1 when the binary is missing. Safe to run concurrently:
# a lock serialises builds and the binary appears atomically.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
wrapper=$repo/tools/kube-apiserver

# The version is the one the wrapper module requires.
version=$(cd "$wrapper" && GOWORK=off go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [[ ! $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]]; then
	echo "build-kube-apiserver: $wrapper/go.mod requires k8s.io/kubernetes '$version', not vX.Y.Z" >&2
	exit 1
fi
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}

cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}
dir=$cache/kube-apiserver-$version
bin=$dir/kube-apiserver
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
[ "${1:-}" = --check ] && exit 1 # not built: say so, build nothing

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [ -x "$bin" ]; then # built by whoever held the lock
	echo "$bin"
	exit 0
fi

# The same version variables as Kubernetes' own builds (hack/lib/version.sh):
# kube-apiserver derives its binary and emulation versions from gitVersion.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

echo "build-kube-apiserver: building kube-apiserver $version into $dir (about 10 minutes on 2 cores)" >&2
start=$(date +%s)
tmp=$(mktemp "$dir/.kube-apiserver.XXXXXX")
trap 'rm -f "$tmp"' EXIT
(
	cd "$wrapper"
	GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly \
		go build -trimpath -ldflags "$ldflags" -o "$tmp" k8s.io/kubernetes/cmd/kube-apiserver
)
chmod 0755 "$tmp"
"$tmp" --version >&2
mv -f "$tmp" "$bin"
trap - EXIT
echo "build-kube-apiserver: built in $(($(date +%s) - start))s" >&2
echo "$bin"
