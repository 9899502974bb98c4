#!/usr/bin/env bash
# Real-GPU proof of profi: a PyTorch process does a fixed amount of inference-like work on
# the GPU (eager matmuls and elementwise ops, synchronize, pinned and pageable copies, CUDA
# graph replays, single-rank NCCL all_reduce); profi attaches after it started; profi's
# /metrics deltas are compared with torch.profiler's counts, per operation, and the
# measured phase is timed with profi attached and not, for --kernel-mode anonymous and full.
#
#   sudo test/gpu/prove.sh              GPU machine: PyTorch with CUDA, root, bin/profi (make build)
#   sudo test/gpu/prove.sh --dry-run    any machine with BPF: the same orchestration and
#                                       comparison, on profi's stub libraries (no GPU, no torch)
#
# Options: --out DIR (default: $OUT, else ./gpu-proof-out), --profi BIN (default: bin/profi),
# --python PY (default: python3), --reps N (default 20; dry run 3), --modes LIST (default
# anonymous,full), --probe-profile lean|full (default full), --fixtures DIR (dry run; default:
# built with `go run ./test/fixtures`), --timeout SECS (whole run; default 300).
# Writes DIR/results.json, DIR/results.md, DIR/raw.tar.gz and prints the markdown.
# Exit status: 0 every count matches or is explained; 1 a mismatch or a failed step;
# 3 this machine cannot run BPF (e.g. gVisor); 2 usage.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/gpu-proof-out}
profi=$root/bin/profi
python=python3
dry=0
reps=
modes=anonymous,full
profile=full
fixtures=
timeout=300

die() { echo "prove.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	--dry-run) dry=1 ;;
	--out) out=$2; shift ;;
	--profi) profi=$2; shift ;;
	--python) python=$2; shift ;;
	--reps) reps=$2; shift ;;
	--modes) modes=$2; shift ;;
	--probe-profile) profile=$2; shift ;;
	--fixtures) fixtures=$2; shift ;;
	--timeout) timeout=$2; shift ;;
	-h|--help) sed -n '2,17p' "$0"; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
	shift
done

[ -x "$profi" ] || die "no profi binary at $profi: run 'make build' (and carry bin/profi to the GPU machine)"
command -v "$python" >/dev/null || die "$python not found"
mkdir -p "$out"
out=$(cd "$out" && pwd)

args=(--profi "$profi" --out "$out" --python "$python" --modes "$modes" --probe-profile "$profile")
if [ "$dry" = 1 ]; then
	if [ -z "$fixtures" ]; then
		fixtures=$(mktemp -d /tmp/profi-gpu-fixtures.XXXXXX)
		(cd "$root" && go run ./test/fixtures "$fixtures" >/dev/null)
	fi
	args+=(--backend stub --fixtures "$fixtures" --reps "${reps:-3}"
		# the host's own /usr/local/cuda (if any) is not part of the dry run; nor is NVML
		--agent-arg=--cudart=/nonexistent/libcudart.so --agent-arg=--disable-nvml
		--workload-arg=--steps=20 --workload-arg=--sync-every=10 --workload-arg=--copies=4
		--workload-arg=--graph-replays=5 --workload-arg=--capture-replays=4 --workload-arg=--allreduces=5
		--workload-arg=--warmup=1)
else
	args+=(--backend torch --reps "${reps:-20}")
fi

export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# prove.py stops profi and the workload and writes its results when TERM arrives.
exec timeout --signal=TERM --kill-after=30 "$timeout" "$python" "$root/test/gpu/prove.py" "${args[@]}"
