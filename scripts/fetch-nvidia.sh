#!/usr/bin/env bash
# Fetches NVIDIA's real CUDA runtime, driver library and NVTX from Debian
# bookworm's non-free component, for tests that run profi against NVIDIA's
# own binaries (internal/testutil/nvidia.go), and prints their paths:
#   PROFI_NVIDIA_CUDART=.../libcudart.so.11.8.89
#   PROFI_NVIDIA_CUDA=.../nvidia/current/libcuda.so.535.*
#   PROFI_NVIDIA_NVTX=.../libnvToolsExt.so.1
#
# The system's apt sources are left alone: a private sources list (the
# machine's own Debian mirror, suite bookworm, component non-free) and a
# private apt state and cache are used. The packages are downloaded, never
# installed (their dependencies are not fetched), and unpacked with
# dpkg-deb -x into a cache outside the repository:
#   ${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/nvidia/PACKAGE_VERSION/
# When every package is unpacked there, the script only prints the paths (no
# network); with --check it fetches nothing and exits 1 when one is missing.
# Never commit these files: NVIDIA's licence allows running them,
# not redistributing them. Safe to run concurrently (a lock serialises it).
#
# PROFI_DEBIAN_MIRROR overrides the mirror (default: the URI of the machine's
# Debian archive in /etc/apt/sources.list*, else http://deb.debian.org/debian).
set -euo pipefail
packages=(libcudart11.0 libcuda1 libnvtoolsext1)
cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/nvidia

die() {
	echo "fetch-nvidia: $*" >&2
	exit 1
}

# unpacked PACKAGE: the cache directory holding PACKAGE, or nothing.
unpacked() {
	local d
	for d in "$cache/$1"_*/; do
		[ -f "$d.complete" ] && { echo "${d%/}"; return; }
	done
	return 0
}

# print: the paths of the three libraries, or fail naming what is missing.
print() {
	local rt drv nvtx
	rt=$(find "$(unpacked libcudart11.0)" -name 'libcudart.so.11.*.*' -type f | sort | tail -n 1)
	drv=$(find "$(unpacked libcuda1)" -path '*/nvidia/current/libcuda.so.*.*' -type f | sort | tail -n 1)
	nvtx=$(find "$(unpacked libnvtoolsext1)" -name 'libnvToolsExt.so.1' | sort | tail -n 1)
	[ -n "$rt" ] || die "no libcudart.so.11.*.* in $(unpacked libcudart11.0)"
	[ -n "$drv" ] || die "no nvidia/current/libcuda.so.* in $(unpacked libcuda1)"
	[ -n "$nvtx" ] || die "no libnvToolsExt.so.1 in $(unpacked libnvtoolsext1)"
	echo "PROFI_NVIDIA_CUDART=$rt"
	echo "PROFI_NVIDIA_CUDA=$drv"
	echo "PROFI_NVIDIA_NVTX=$nvtx"
}

complete() {
	local p
	for p in "${packages[@]}"; do
		[ -n "$(unpacked "$p")" ] || return 1
	done
}

if complete; then
	print
	exit 0
fi
[ "${1:-}" = --check ] && exit 1 # not fetched: say so, fetch nothing

for tool in apt-get dpkg-deb flock; do
	command -v "$tool" >/dev/null || die "needs $tool (Debian's apt, dpkg, util-linux)"
done
mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] ||
	die "cannot write $cache: run as root (sudo make test) or set PROFI_TOOLS_CACHE"
exec 9>"$cache/.lock"
flock 9
if complete; then # fetched by whoever held the lock
	print
	exit 0
fi

# shellcheck source=lib/debian-mirror.sh
. "$(dirname "$0")/lib/debian-mirror.sh"

apt=$cache/.apt
rm -rf "$apt"
mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "needs $keyring (Debian package debian-archive-keyring)"
echo "deb [signed-by=$keyring] $url bookworm non-free" >"$apt/sources.list"
opts=(
	-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=-
	-o "Dir::State=$apt/state" -o "Dir::State::Lists=$apt/state/lists"
	-o Dir::State::status=/var/lib/dpkg/status -o "Dir::Cache=$apt/cache"
	-o Debug::NoLocking=1
)
[ "$(id -u)" = 0 ] && opts+=(-o APT::Sandbox::User=root) # private dirs: no _apt sandbox
echo "fetch-nvidia: reading $url bookworm non-free (private apt state in $apt)" >&2
apt-get "${opts[@]}" -qq update >&2 || die "apt-get update of $url bookworm non-free failed"
(cd "$apt/debs" && apt-get "${opts[@]}" -qq download "${packages[@]}" >&2) ||
	die "apt-get download ${packages[*]} failed"

for deb in "$apt"/debs/*.deb; do
	p=$(dpkg-deb -f "$deb" Package)
	v=$(dpkg-deb -f "$deb" Version)
	[ -n "$(unpacked "$p")" ] && continue
	dir=$cache/${p}_${v//:/%3a}
	rm -rf "$dir"
	dpkg-deb -x "$deb" "$dir"
	touch "$dir/.complete"
	echo "fetch-nvidia: $p $v unpacked into $dir" >&2
done
rm -rf "$apt"
complete || die "not every one of ${packages[*]} was fetched"
print
