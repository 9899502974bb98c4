#!/usr/bin/env bash
# Builds the profi image without a registry or a Docker daemon (`make image`;
# CI: test/e2e/image_test.go): buildah bud on the Containerfile, FROM scratch,
# with a root filesystem assembled here from this Debian machine:
#   /usr/bin/profi                      the agent (cgo, as the Dockerfile builds it)
#   the shared objects it links         from `ldd` (glibc: libc.so.6 and the loader)
#   /etc/ssl/certs/ca-certificates.crt  Debian's ca-certificates bundle
#
# Usage: scripts/build-image.sh [--binary PATH] [--tag IMAGE] [--version V]
#   --binary   use this agent binary instead of building one (it must be the
#              cgo build of cmd/profi; the e2e test passes the binary the other
#              end-to-end tests run)
#   --tag      image name (default localhost/profi:VERSION)
#   --version  version label and main.version (default: git describe)
# Prints the image ID on the last line. buildah uses its usual configuration:
# CONTAINERS_STORAGE_CONF / CONTAINERS_CONF select private storage (the test
# does), otherwise the machine's (root: /var/lib/containers).
set -euo pipefail
cd "$(dirname "$0")/.."

binary="" tag="" version=""
while [ $# -gt 0 ]; do
	case $1 in
	--binary) binary=$2; shift 2 ;;
	--tag) tag=$2; shift 2 ;;
	--version) version=$2; shift 2 ;;
	*) echo "usage: $0 [--binary PATH] [--tag IMAGE] [--version V]" >&2; exit 2 ;;
	esac
done
for tool in buildah ldd; do
	command -v "$tool" >/dev/null || { echo "build-image: $tool not found (Debian packages buildah, libc-bin)" >&2; exit 1; }
done
version=${version:-$(git describe --always --dirty 2>/dev/null || echo dev)}
tag=${tag:-localhost/profi:$version}
certs=/etc/ssl/certs/ca-certificates.crt
[ -r "$certs" ] || { echo "build-image: $certs missing (Debian package ca-certificates)" >&2; exit 1; }

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/bin" "$root/etc/ssl/certs"
if [ -n "$binary" ]; then
	cp "$binary" "$root/usr/bin/profi"
else
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations \
		go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$root/usr/bin/profi" ./cmd/profi
fi
chmod 0755 "$root/usr/bin/profi"

# Every shared object the agent links, at the path the loader looks for it
# (the interpreter is the line without "=>"; the vDSO has no file).
libs=$(ldd "$root/usr/bin/profi") || { echo "build-image: ldd failed: is the binary dynamically linked?" >&2; exit 1; }
n=0
while read -r name arrow path _; do
	case $name in linux-vdso.so.* | linux-gate.so.*) continue ;; esac
	[ "$arrow" = "=>" ] || path=$name
	case $path in
	/*) ;;
	*) echo "build-image: cannot resolve $name (ldd: $name $arrow $path)" >&2; exit 1 ;;
	esac
	mkdir -p "$root$(dirname "$path")"
	cp -L --preserve=mode "$path" "$root$path"
	n=$((n + 1))
done <<<"$libs"
cp -L "$certs" "$root$certs"

cp Containerfile "$ctx/Containerfile"
echo "build-image: $tag: profi $version, $n shared objects, CA bundle ($(du -sh "$root" | cut -f1))" >&2
buildah bud --quiet --layers=false --pull=never --timestamp 0 --build-arg "VERSION=$version" \
	-f "$ctx/Containerfile" -t "$tag" "$ctx"
