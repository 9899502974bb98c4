#!/usr/bin/env bash
# Builds the profi image without a registry or a Docker daemon (`make image`;
# CI: test/e2e/image_test.go): buildah bud on the Containerfile, FROM scratch,
# with a root filesystem assembled here from this Debian machine:
#   /usr/bin/profi                      the agent (cgo, as the Dockerfile builds it)
#   the shared objects it links         its NEEDED entries and interpreter, resolved
#                                       in the C library of the image's architecture
#   /etc/ssl/certs/ca-certificates.crt  Debian's ca-certificates bundle
#
# Both architectures profi supports (README: x86-64 and arm64, NVIDIA Grace)
# build on either: an arm64 image on an x86-64 machine is cross-compiled with
# aarch64-linux-gnu-gcc (cgo: go-nvml) and gets the glibc of Debian's
# libc6-arm64-cross, which is Debian's arm64 glibc under /usr/aarch64-linux-gnu.
# Nothing in the image runs at build time, so no emulation is needed.
#
# Usage: scripts/build-image.sh [--arch amd64|arm64] [--binary PATH] [--tag IMAGE] [--version V]
#        scripts/build-image.sh --manifest IMAGE [--version V]
#   --arch      the image's architecture (default: this machine's)
#   --binary    use this agent binary instead of building one (it must be the
#               cgo build of cmd/profi for --arch; the e2e test passes the
#               binary the other end-to-end tests run)
#   --tag       image name (default localhost/profi:VERSION)
#   --version   version label and main.version (default: git describe)
#   --manifest  build both architectures as IMAGE-amd64 and IMAGE-arm64 and a
#               manifest list IMAGE naming both (what a registry serves to
#               x86-64 and Grace nodes alike); --binary-amd64 PATH and
#               --binary-arm64 PATH use those agents instead of building them
# Prints the image ID (with --manifest, the manifest list's name) on the
# last line. buildah uses its usual configuration: CONTAINERS_STORAGE_CONF /
# CONTAINERS_CONF select private storage (the test does), otherwise the
# machine's (root: /var/lib/containers).
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: $0 [--arch amd64|arm64] [--binary PATH] [--tag IMAGE] [--version V] | --manifest IMAGE [--binary-amd64 PATH] [--binary-arm64 PATH] [--version V]"
arch="" binary="" tag="" version="" manifest=""
declare -A binaries=()
while [ $# -gt 0 ]; do
	case $1 in
	--arch) arch=$2; shift 2 ;;
	--binary) binary=$2; shift 2 ;;
	--tag) tag=$2; shift 2 ;;
	--version) version=$2; shift 2 ;;
	--manifest) manifest=$2; shift 2 ;;
	--binary-amd64 | --binary-arm64) binaries[${1#--binary-}]=$2; shift 2 ;;
	*) echo "$usage" >&2; exit 2 ;;
	esac
done
for tool in buildah readelf go; do
	command -v "$tool" >/dev/null || { echo "build-image: $tool not found (Debian packages buildah, binutils; Go)" >&2; exit 1; }
done
version=${version:-$(git describe --always --dirty 2>/dev/null || echo dev)}

if [ -n "$manifest" ]; then
	[ -z "$arch$binary$tag" ] || { echo "$usage" >&2; exit 2; }
	buildah manifest rm "$manifest" >/dev/null 2>&1 || true
	buildah manifest create "$manifest" >/dev/null
	for a in amd64 arm64; do
		b=()
		[ -z "${binaries[$a]:-}" ] || b=(--binary "${binaries[$a]}")
		"$0" --arch "$a" "${b[@]}" --tag "$manifest-$a" --version "$version" >/dev/null
		buildah manifest add "$manifest" "containers-storage:$manifest-$a" >/dev/null
	done
	echo "build-image: $manifest: manifest list of $manifest-amd64 and $manifest-arm64" >&2
	echo "$manifest"
	exit 0
fi

host=$(go env GOHOSTARCH)
arch=${arch:-$host}
tag=${tag:-localhost/profi:$version}
# The C library per architecture: where its files are on this machine
# (libdir), where the image's loader looks for them (imgdir), and the
# cross compiler when this machine is of another architecture.
case $arch in
amd64)
	imgdir=/lib/x86_64-linux-gnu libdir=$imgdir cc=x86_64-linux-gnu-gcc machine="Advanced Micro Devices X86-64"
	;;
arm64)
	imgdir=/lib/aarch64-linux-gnu libdir=$imgdir cc=aarch64-linux-gnu-gcc machine=AArch64
	[ "$host" = arm64 ] || libdir=/usr/aarch64-linux-gnu/lib
	;;
*) echo "build-image: --arch $arch: profi builds for amd64 and arm64" >&2; exit 2 ;;
esac
[ "$host" = "$arch" ] && cc=gcc
certs=/etc/ssl/certs/ca-certificates.crt
[ -r "$certs" ] || { echo "build-image: $certs missing (Debian package ca-certificates)" >&2; exit 1; }
[ -r "$libdir/libc.so.6" ] || {
	echo "build-image: no $arch C library in $libdir (Debian package libc6-dev-arm64-cross for an arm64 image here)" >&2
	exit 1
}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/bin" "$root/etc/ssl/certs"
if [ -n "$binary" ]; then
	cp "$binary" "$root/usr/bin/profi"
else
	command -v "$cc" >/dev/null || { echo "build-image: $cc not found (Debian package gcc-aarch64-linux-gnu)" >&2; exit 1; }
	CC=$cc GOARCH=$arch CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations \
		go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$root/usr/bin/profi" ./cmd/profi
fi
chmod 0755 "$root/usr/bin/profi"
got=$(readelf -h "$root/usr/bin/profi" | sed -n 's/^ *Machine: *//p')
[ "$got" = "$machine" ] || { echo "build-image: the binary is for $got, not $arch ($machine)" >&2; exit 1; }

# Every shared object the agent needs, and theirs, at the path the image's
# loader looks for it: the interpreter at its PT_INTERP path, the rest in
# the architecture's library directory. Read from the ELF files (readelf),
# not by running them (ldd), so an arm64 image builds on x86-64 too.
interp=$(readelf -l "$root/usr/bin/profi" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
[ -n "$interp" ] || { echo "build-image: the agent has no interpreter: is it dynamically linked (cgo)?" >&2; exit 1; }
mkdir -p "$root$(dirname "$interp")" "$root$imgdir"
cp -L --preserve=mode "$libdir/$(basename "$interp")" "$root$interp"
queue=("$root/usr/bin/profi") n=1
while [ ${#queue[@]} -gt 0 ]; do
	f=${queue[0]}
	queue=("${queue[@]:1}")
	for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'); do
		[ -e "$root$imgdir/$lib" ] && continue
		[ "$lib" = "$(basename "$interp")" ] && continue # the loader, loaded already
		[ -r "$libdir/$lib" ] || { echo "build-image: $lib (needed by $(basename "$f")) not in $libdir" >&2; exit 1; }
		cp -L --preserve=mode "$libdir/$lib" "$root$imgdir/$lib"
		queue+=("$root$imgdir/$lib")
		n=$((n + 1))
	done
done
cp -L "$certs" "$root$certs"

cp Containerfile "$ctx/Containerfile"
echo "build-image: $tag: profi $version for $arch, $n shared objects, CA bundle ($(du -sh "$root" | cut -f1))" >&2
buildah bud --quiet --layers=false --pull=never --timestamp 0 --build-arg "VERSION=$version" --platform "linux/$arch" \
	-f "$ctx/Containerfile" -t "$tag" "$ctx"
