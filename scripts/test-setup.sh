#!/usr/bin/env bash
# Provides what `make test` and `make chart-check` need on a fresh Debian
# machine (the Makefile's test-setup target runs it first), or fails with one
# line saying what is missing:
#   - Debian packages: gcc, libc6-dev, make, binutils (stub libraries and
#     workloads, c++filt), util-linux (unshare, setpriv, flock), python3,
#     prometheus (promtool and the server), etcd-server (etcd), tmux (the
#     terminal `profi top` is tested in), buildah, podman and runc (the
#     image, built without a registry and run under the chart's
#     securityContext: scripts/build-image.sh, test/e2e/image_test.go; podman
#     runs with a private configuration, never the machine's),
#     ca-certificates (the image's CA bundle), qemu-system-x86 and
#     qemu-system-arm (the VM kernel matrix, test/vm), gcc-aarch64-linux-gnu and
#     libc6-dev-arm64-cross (arm64 placement tested on cross-compiled code,
#     the fixtures cross-built: internal/attach/uprobe, internal/testutil;
#     the arm64 image), qemu-user (the arm64 image's agent run from its own
#     root filesystem: test/e2e/image_arch_test.go);
#     apt-get install, apt-get update first, only for what is missing;
#   - kube-apiserver, kubelet, kube-controller-manager, kube-scheduler,
#     kube-proxy and helm, built once into the tools cache by
#     scripts/build-kube.sh (about 10 minutes for the API server, 10 more
#     for the rest, on 2 cores) and scripts/build-helm.sh (about 6 minutes);
#   - the test node's runtime (internal/testutil/kubetest/node.go):
#     containerd (ctr, the runc shim), containernetworking-plugins (bridge,
#     host-local, loopback), iptables (kube-proxy), iproute2 (the bridge);
#   - NVIDIA's real libcudart, libcuda and NVTX (CUDA 11.8, driver 535) and
#     CUDA 12.4 (runtime, nvcc, driver 550, NCCL 2.29, trixie's glibc),
#     fetched once into the same cache by scripts/fetch-nvidia.sh (about 3
#     minutes fresh, 1.1 GB downloaded, 420 MB kept);
#   - Debian's cloud kernels of the VM kernel matrix and their static
#     busybox, fetched once into the same cache by scripts/fetch-kernels.sh
#     (about 20 seconds).
# When everything is there it only checks (well under a second). Root is
# needed to install packages, and to write the default cache
# /var/cache/profi-tools (PROFI_TOOLS_CACHE moves it; PROFI_KUBE_APISERVER
# and PROFI_HELM name binaries to use instead of building them).
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
	echo "profi tests need: $*" >&2
	exit 1
}

command -v go >/dev/null ||
	die "Go (go.mod's version) in PATH; under sudo keep your PATH: sudo env \"PATH=\$PATH\" make test"

# Debian package -> what shows it is installed (a command, or path:FILE).
requirements=(
	"gcc gcc"
	"g++-12 g++-12" # nvcc 12.4's host compiler (test/e2e/nvidia12_test.go)
	"libc6-dev path:/usr/include/stdio.h"
	"make make"
	"binutils c++filt"
	"util-linux unshare setpriv flock"
	"python3 python3"
	"prometheus promtool prometheus"
	"etcd-server etcd"
	"tmux tmux"
	"dpkg dpkg-deb"
	"buildah buildah"
	"podman podman"
	"runc runc"
	"containerd containerd ctr containerd-shim-runc-v2"
	"containernetworking-plugins path:/usr/lib/cni/bridge path:/usr/lib/cni/host-local path:/usr/lib/cni/loopback"
	"iptables iptables iptables-restore"
	"iproute2 ip"
	"ca-certificates path:/etc/ssl/certs/ca-certificates.crt"
	"debian-archive-keyring path:/usr/share/keyrings/debian-archive-keyring.gpg"
	"qemu-system-x86 qemu-system-x86_64"
	"qemu-system-arm qemu-system-aarch64"
	"qemu-user qemu-aarch64"
	"gcc-aarch64-linux-gnu aarch64-linux-gnu-gcc aarch64-linux-gnu-objdump"
	"libc6-dev-arm64-cross path:/usr/aarch64-linux-gnu/include/stdio.h"
)
packages=()
for r in "${requirements[@]}"; do
	read -r pkg probes <<<"$r"
	for p in $probes; do
		case $p in
		path:*) [ -e "${p#path:}" ] && continue ;;
		*) command -v "$p" >/dev/null && continue ;;
		esac
		packages+=("$pkg")
		break
	done
done

# Built or fetched into the tools cache.
tools=()
[ -n "${PROFI_KUBE_APISERVER:-}" ] || bash scripts/build-kube.sh --check kube-apiserver >/dev/null ||
	tools+=(kube-apiserver)
bash scripts/build-kube.sh --check kubelet kube-controller-manager kube-scheduler kube-proxy >/dev/null ||
	tools+=(kube-node)
[ -n "${PROFI_HELM:-}" ] || bash scripts/build-helm.sh --check >/dev/null || tools+=(helm)
bash scripts/fetch-nvidia.sh --check >/dev/null || tools+=(nvidia)
{ bash scripts/fetch-kernels.sh --check amd64 && bash scripts/fetch-kernels.sh --check arm64; } >/dev/null ||
	tools+=(kernels)

[ ${#packages[@]} -eq 0 ] && [ ${#tools[@]} -eq 0 ] && exit 0

cache=${PROFI_TOOLS_CACHE:-/var/cache/profi-tools}
missing=()
[ ${#packages[@]} -gt 0 ] && missing+=("Debian packages ${packages[*]}")
if [ ${#tools[@]} -gt 0 ]; then
	names=$(printf '%s, ' "${tools[@]}")
	names=${names%, }
	names=${names/kube-node/kubelet, kube-controller-manager, kube-scheduler, kube-proxy}
	names=${names/nvidia/NVIDIA\'s libcudart, libcuda, NVTX, nvcc and NCCL}
	missing+=("${names/kernels/Debian\'s cloud kernels} (built or fetched into $cache)")
fi
if [ "$(id -u)" != 0 ]; then
	if [ ${#packages[@]} -gt 0 ] || ! { mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; }; then
		msg=$(printf '%s; ' "${missing[@]}")
		die "${msg%; }; run sudo make test (it installs them)"
	fi
fi

if [ ${#packages[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "${missing[0]} (no apt-get here: install them)"
	echo "test-setup: installing ${packages[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
# The downloads (network-bound) run beside the builds (CPU-bound); one go
# build makes every missing Kubernetes binary, sharing their packages.
fetches=()
kube=()
for t in "${tools[@]}"; do
	case $t in
	nvidia)
		bash scripts/fetch-nvidia.sh >/dev/null &
		fetches+=($!)
		;;
	kernels)
		{ bash scripts/fetch-kernels.sh amd64 && bash scripts/fetch-kernels.sh arm64; } >/dev/null &
		fetches+=($!)
		;;
	esac
done
for t in "${tools[@]}"; do
	case $t in
	kube-apiserver) kube+=(kube-apiserver) ;;
	kube-node) kube+=(kubelet kube-controller-manager kube-scheduler kube-proxy) ;;
	esac
done
[ ${#kube[@]} -eq 0 ] || bash scripts/build-kube.sh "${kube[@]}" >/dev/null
for t in "${tools[@]}"; do
	[ "$t" = helm ] && bash scripts/build-helm.sh >/dev/null
done
for p in "${fetches[@]}"; do
	wait "$p" || die "the downloads above (scripts/fetch-nvidia.sh, scripts/fetch-kernels.sh) failed"
done
echo "test-setup: done" >&2
