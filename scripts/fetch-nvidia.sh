#!/usr/bin/env bash
# Fetches NVIDIA's real CUDA stacks from Debian, for tests that run profi
# against NVIDIA's own binaries (internal/testutil/nvidia.go), and prints
# their paths:
#   CUDA 11.8 (bookworm non-free):
#   PROFI_NVIDIA_CUDART=.../libcudart.so.11.8.89
#   PROFI_NVIDIA_CUDA=.../nvidia/current/libcuda.so.535.*
#   PROFI_NVIDIA_NVTX=.../libnvToolsExt.so.1
#   CUDA 12.4 (trixie non-free and main, sid contrib):
#   PROFI_NVIDIA_CUDART12=.../libcudart.so.12.4.127
#   PROFI_NVIDIA_CUDA550=.../nvidia/current/libcuda.so.550.*
#   PROFI_NVIDIA_NCCL=.../libnccl.so.2.29.* (needs glibc 2.38: run it
#     through PROFI_NVIDIA_LDSO, trixie's dynamic loader, glibc 2.41)
#   PROFI_NVIDIA_LDSO=.../ld-linux-x86-64.so.2
#   PROFI_NVIDIA_NVCC=.../nvidia-cuda-toolkit/bin/nvcc (nvcc 12.4.131 with
#     a private nvcc.profile naming the headers and the static runtime
#     unpacked here; host compiler g++-12, passed as -ccbin g++-12)
#
# Of nvidia-cuda-toolkit only what nvcc runs is unpacked (about 130 MB of
# 200), of nvidia-cuda-dev (a 934 MB .deb of every CUDA library) only the
# headers, libcudart_static.a and libcudadevrt.a (18 MB): decompressing it is
# most of the fetch (about 40-60 s here; a fresh fetch about 90 s in all,
# 1.1 GB downloaded, 420 MB kept).
#
# The system's apt sources are left alone: a private sources list (the
# machine's own Debian mirror) and a private apt state and cache are used.
# The packages are downloaded, never installed (their dependencies are not
# fetched), and unpacked with dpkg-deb into a cache outside the repository:
#   ${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/nvidia/PACKAGE_VERSION/
# When every package is unpacked there, the script only prints the paths (no
# network); with --check it fetches nothing and exits 1 when one is missing.
# Never commit these files: NVIDIA's licence allows running them,
# not redistributing them. Safe to run concurrently (a lock serialises it).
#
# PROFI_DEBIAN_MIRROR overrides the mirror (default: the URI of the machine's
# Debian archive in /etc/apt/sources.list*, else http://deb.debian.org/debian).
set -euo pipefail
# Each package: NAME/SUITE, the cache directory glob (PACKAGE_VERSION), and
# what of it to unpack (tar patterns; empty: everything).
arch=x86_64-linux-gnu
packages=(
	"libcudart11.0/bookworm|libcudart11.0_11.*|"
	"libcuda1/bookworm|libcuda1_535.*|"
	"libnvtoolsext1/bookworm|libnvtoolsext1_11.*|"
	"libcudart12/trixie|libcudart12_12.*|"
	"libcuda1/trixie|libcuda1_550.*|"
	"libnccl2/sid|libnccl2_2.29.*|"
	"libc6/trixie|libc6_2.41*|./usr/lib/$arch/* ./usr/lib64/*"
	"nvidia-cuda-toolkit/trixie|nvidia-cuda-toolkit_12.*|./usr/bin/nvcc ./usr/bin/cudafe++ ./usr/bin/fatbinary ./usr/bin/nvlink ./usr/bin/ptxas ./usr/bin/bin2c ./usr/lib/nvidia-cuda-toolkit/bin/* ./usr/lib/nvidia-cuda-toolkit/libdevice/*"
	"nvidia-cuda-dev/trixie|nvidia-cuda-dev_12.*|./usr/include/* ./usr/lib/$arch/libcudart_static.a ./usr/lib/$arch/libcudadevrt.a"
)
cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}/nvidia

die() {
	echo "fetch-nvidia: $*" >&2
	exit 1
}

# unpacked GLOB: the cache directory matching GLOB that is complete, or nothing.
unpacked() {
	local d
	for d in "$cache"/$1/; do
		[ -f "$d.complete" ] && { echo "${d%/}"; return; }
	done
	return 0
}

# one GLOB NAME: the newest file NAME (a find -path pattern) under the
# complete cache directory GLOB, or fail naming it.
one() {
	local d f
	d=$(unpacked "$1")
	f=$(find "$d" -path "$2" \( -type f -o -type l \) | sort | tail -n 1)
	[ -n "$f" ] || die "no $2 in $d"
	echo "$f"
}

# print: the paths of the libraries and tools, or fail naming what is missing.
print() {
	echo "PROFI_NVIDIA_CUDART=$(one 'libcudart11.0_11.*' "*/libcudart.so.11.*.*")"
	echo "PROFI_NVIDIA_CUDA=$(one 'libcuda1_535.*' '*/nvidia/current/libcuda.so.*.*')"
	echo "PROFI_NVIDIA_NVTX=$(one 'libnvtoolsext1_11.*' '*/libnvToolsExt.so.1')"
	echo "PROFI_NVIDIA_CUDART12=$(one 'libcudart12_12.*' '*/libcudart.so.12.*.*')"
	echo "PROFI_NVIDIA_CUDA550=$(one 'libcuda1_550.*' '*/nvidia/current/libcuda.so.*.*')"
	echo "PROFI_NVIDIA_NCCL=$(one 'libnccl2_2.29.*' '*/libnccl.so.2.*.*')"
	echo "PROFI_NVIDIA_LDSO=$(one 'libc6_2.41*' "*/usr/lib/$arch/ld-linux-x86-64.so.2")"
	echo "PROFI_NVIDIA_NVCC=$(one 'nvidia-cuda-toolkit_12.*' '*/usr/lib/nvidia-cuda-toolkit/bin/nvcc')"
}

complete() {
	local e
	for e in "${packages[@]}"; do
		IFS='|' read -r _ glob _ <<<"$e"
		[ -n "$(unpacked "$glob")" ] || return 1
	done
}

if complete; then
	print
	exit 0
fi
[ "${1:-}" = --check ] && exit 1 # not fetched: say so, fetch nothing

for tool in apt-get dpkg-deb flock tar; do
	command -v "$tool" >/dev/null || die "needs $tool (Debian's apt, dpkg, tar, util-linux)"
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
# trixie main only for libc6 (its loader runs NCCL 2.29, which needs glibc
# 2.38); sid contrib only for libnccl2 2.29 (trixie has 2.22).
cat >"$apt/sources.list" <<EOF
deb [signed-by=$keyring] $url bookworm non-free
deb [signed-by=$keyring] $url trixie main non-free
deb [signed-by=$keyring] $url sid contrib
EOF
opts=(
	-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=-
	-o "Dir::State=$apt/state" -o "Dir::State::Lists=$apt/state/lists"
	-o Dir::State::status=/var/lib/dpkg/status -o "Dir::Cache=$apt/cache"
	-o Debug::NoLocking=1
)
[ "$(id -u)" = 0 ] && opts+=(-o APT::Sandbox::User=root) # private dirs: no _apt sandbox
echo "fetch-nvidia: reading $url bookworm non-free, trixie main non-free, sid contrib (private apt state in $apt)" >&2
apt-get "${opts[@]}" -qq update >&2 || die "apt-get update of $url failed"

for e in "${packages[@]}"; do
	IFS='|' read -r spec glob members <<<"$e"
	[ -n "$(unpacked "$glob")" ] && continue
	rm -f "$apt"/debs/*.deb
	(cd "$apt/debs" && apt-get "${opts[@]}" -qq download "$spec" >&2) || die "apt-get download $spec failed"
	deb=$(echo "$apt"/debs/*.deb)
	p=$(dpkg-deb -f "$deb" Package)
	v=$(dpkg-deb -f "$deb" Version)
	dir=$cache/${p}_${v//:/%3a}
	# shellcheck disable=SC2053 # glob match on purpose
	[[ ${dir##*/} == $glob ]] || die "$spec is $p $v, not $glob"
	rm -rf "$dir"
	mkdir -p "$dir"
	if [ -z "$members" ]; then
		dpkg-deb -x "$deb" "$dir"
	else
		read -ra pats <<<"$members"
		dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir" --wildcards "${pats[@]}"
	fi
	echo "fetch-nvidia: $p $v unpacked into $dir" >&2
	if [ "$p" = nvidia-cuda-toolkit ]; then
		toolkit=$dir
	else
		touch "$dir/.complete"
	fi
done

# nvcc reads nvcc.profile beside itself (the package's is a link to
# /etc/nvcc.profile, which names /usr): name the directories unpacked here.
# libcudart.so for -cudart shared: a link beside libcudart12's library.
if [ -n "${toolkit:-}" ]; then
	dev=$(unpacked 'nvidia-cuda-dev_12.*')
	rt=$(unpacked 'libcudart12_12.*')
	[ -n "$dev" ] && [ -n "$rt" ] || die "nvidia-cuda-dev or libcudart12 missing"
	ln -sfn libcudart.so.12 "$rt/usr/lib/$arch/libcudart.so"
	rm -f "$toolkit/usr/lib/nvidia-cuda-toolkit/bin/nvcc.profile"
	cat >"$toolkit/usr/lib/nvidia-cuda-toolkit/bin/nvcc.profile" <<EOF
NVVMIR_LIBRARY_DIR = $toolkit/usr/lib/nvidia-cuda-toolkit/libdevice
PATH += $toolkit/usr/lib/nvidia-cuda-toolkit/bin:$toolkit/usr/bin:
INCLUDES += -I$dev/usr/include \$(_SPACE_)
LIBRARIES =+ \$(_SPACE_) -L$dev/usr/lib/$arch -L$rt/usr/lib/$arch
EOF
	touch "$toolkit/.complete"
fi
rm -rf "$apt"
complete || die "not every package was fetched"
print
