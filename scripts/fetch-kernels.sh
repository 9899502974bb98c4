#!/usr/bin/env bash
# Fetches the kernels of the VM kernel matrix (test/vm) from Debian and
# prints where they are, one line per suite:
#   SUITE=/var/cache/profi-tools/kernels/ARCH-SUITE
# Each such directory holds vmlinuz (the cloud kernel: BPF, BTF, uprobes and
# the serial console built in, so an initramfs alone boots it), busybox (the
# suite's static busybox for ARCH: the VM's shell) and version (the kernel
# package and its version).
#
# Usage: fetch-kernels.sh [--check] ARCH [SUITE...]   (ARCH: amd64 or arm64)
# Without suites: those of the matrix (test/vm/vm_test.go, `kernels`):
# bullseye (5.10, the refusal), bookworm (6.1), trixie (6.12). sid
# (Debian's newest, 7.x) when asked for: PROFI_VM_NEWEST=1's lanes.
#
# The kernel of a suite is resolved through its linux-image-cloud-ARCH
# metapackage (the versioned package name changes with every upload). The
# system's apt sources are left alone: a private sources list (the machine's
# Debian archive, as scripts/fetch-nvidia.sh finds it), a private apt state
# and cache; the packages are downloaded, never installed, and unpacked with
# dpkg-deb -x into ${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/kernels/.
# Once there nothing is fetched again (no network); --check fetches nothing
# and exits 1 when one is missing. Never commit these files. Safe to run
# concurrently (a lock serialises it).
set -euo pipefail

die() {
	echo "fetch-kernels: $*" >&2
	exit 1
}

check=
if [ "${1:-}" = --check ]; then
	check=1
	shift
fi
[ $# -ge 1 ] || die "usage: fetch-kernels.sh [--check] amd64|arm64 [SUITE...]"
arch=$1
shift
case $arch in amd64 | arm64) ;; *) die "architecture $arch: want amd64 or arm64" ;; esac
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(bullseye bookworm trixie)
cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/kernels

print() {
	local s
	for s in "${suites[@]}"; do
		echo "$s=$cache/$arch-$s"
	done
}

complete() {
	local s
	for s in "${suites[@]}"; do
		[ -f "$cache/$arch-$s/.complete" ] || return 1
	done
}

if complete; then
	print
	exit 0
fi
[ -n "$check" ] && exit 1 # not fetched: say so, fetch nothing

for tool in apt-get dpkg-deb flock; do
	command -v "$tool" >/dev/null || die "needs $tool (Debian's apt, dpkg, util-linux)"
done
mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] ||
	die "cannot write $cache: run as root (sudo make test) or set PROFI_TOOLS_CACHE"
exec 9>"$cache/.lock"
flock 9

# shellcheck source=lib/debian-mirror.sh
. "$(dirname "$0")/lib/debian-mirror.sh"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "needs $keyring (Debian package debian-archive-keyring)"

for suite in "${suites[@]}"; do
	out=$cache/$arch-$suite
	[ -f "$out/.complete" ] && continue
	apt=$cache/.apt-$arch-$suite
	rm -rf "$apt"
	mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$apt/x"
	echo "deb [arch=$arch signed-by=$keyring] $url $suite main" >"$apt/sources.list"
	opts=(
		-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=-
		-o "Dir::State=$apt/state" -o "Dir::State::Lists=$apt/state/lists"
		-o "Dir::State::status=$apt/state/status" -o "Dir::Cache=$apt/cache"
		-o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
		-o Debug::NoLocking=1
	)
	touch "$apt/state/status" # an empty dpkg database: nothing counts as installed
	[ "$(id -u)" = 0 ] && opts+=(-o APT::Sandbox::User=root) # private dirs: no _apt sandbox
	echo "fetch-kernels: reading $url $suite main for $arch (private apt state in $apt)" >&2
	apt-get "${opts[@]}" -qq update >&2 || die "apt-get update of $url $suite failed"
	meta=linux-image-cloud-$arch
	pkg=$(apt-cache "${opts[@]}" depends "$meta" | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	[ -n "$pkg" ] || die "$suite: $meta depends on no linux-image-VERSION package"
	# From Debian 14 (sid: 7.x) the image package only depends on the one
	# with the kernel itself, linux-binary-VERSION.
	extra=()
	bin=linux-binary-${pkg#linux-image-}
	if apt-cache "${opts[@]}" show "$bin" >/dev/null 2>&1; then
		extra=("$bin")
	fi
	(cd "$apt/debs" && apt-get "${opts[@]}" -qq download "$pkg" "${extra[@]}" busybox-static >&2) ||
		die "$suite: apt-get download $pkg ${extra[*]} busybox-static failed"
	for deb in "$apt"/debs/*.deb; do
		dpkg-deb -x "$deb" "$apt/x"
	done
	rm -rf "$out"
	mkdir -p "$out"
	# boot/vmlinuz-VERSION; from Debian 14 usr/lib/modules/VERSION/vmlinuz.
	vmlinuz=$(find "$apt/x" \( -path '*/boot/vmlinuz-*' -o -path '*/usr/lib/modules/*/vmlinuz' \) -type f | head -n 1)
	[ -n "$vmlinuz" ] || die "$suite: no boot/vmlinuz-* in $pkg"
	busybox=$(find "$apt/x" -path '*bin/busybox' -type f | head -n 1)
	[ -n "$busybox" ] || die "$suite: no bin/busybox in busybox-static"
	cp "$vmlinuz" "$out/vmlinuz"
	cp "$busybox" "$out/busybox"
	{
		dpkg-deb -f "$apt"/debs/linux-image-*.deb Package Version
		dpkg-deb -f "$apt"/debs/busybox-static_*.deb Package Version
	} >"$out/version"
	touch "$out/.complete"
	rm -rf "$apt"
	echo "fetch-kernels: $suite $arch: $pkg into $out" >&2
done
print
