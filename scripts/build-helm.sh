#!/usr/bin/env bash
# Builds Helm v3 for `make chart-check` (scripts/chart-check.sh) with
# `go install helm.sh/helm/v3/cmd/helm@VERSION` and prints the binary's path.
#
# The binary is cached outside the repository, keyed by version:
#   ${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/helm-VERSION/helm
# so only a new machine pays the build (about 6 minutes on 2 cores); when the
# binary is there the script only prints its path. With --check it builds
# nothing and exits 1 when the binary is missing. Safe to run concurrently:
# a lock serialises builds and the binary appears atomically.
set -euo pipefail
version=${HELM_VERSION:-v3.22.0}
cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}
dir=$cache/helm-$version
bin=$dir/helm
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

echo "build-helm: building helm $version into $dir (about 6 minutes on 2 cores)" >&2
start=$(date +%s)
tmpdir=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT
# Outside any module (cd /) so go install resolves helm's own go.mod only.
(cd / && GOWORK=off GOFLAGS= CGO_ENABLED=0 GOBIN="$tmpdir" \
	go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$version")
"$tmpdir/helm" version --short >&2
mv -f "$tmpdir/helm" "$bin"
echo "build-helm: built in $(($(date +%s) - start))s" >&2
echo "$bin"
