#!/usr/bin/env bash
# `sudo make demo`: runs profi against a stub CUDA workload that mimics an
# inference server (threads, streams, launches, copies, allocations, graph
# launches, a few errors), prints a live table, stops cleanly on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "profi demo: loading BPF needs root; run: sudo make demo" >&2
	exit 1
fi
listen=${PROFI_DEMO_LISTEN:-127.0.0.1:9401}
dir=$(go run ./test/fixtures bin/demo)

# The workload runs one measured phase per "go" line: one per second.
(while sleep 1; do echo go; done) | "$dir/workload" --threads 2 --iters 500 >/dev/null &
workload=$!
bin/profi --listen "$listen" --refresh-interval 1 --report-interval 2 --cudart "$dir/libcudart.so.12" &
agent=$!

stop() {
	trap - INT TERM EXIT
	kill "$agent" 2>/dev/null || true
	kill "$workload" 2>/dev/null || true
	wait 2>/dev/null || true
	echo "profi demo stopped."
}
trap stop INT TERM EXIT

echo "profi demo: workload pid $workload, agent pid $agent"
echo "  metrics: curl -s http://$listen/metrics | grep ^profi_cuda"
echo "  status:  curl -s http://$listen/status"
echo "  Ctrl-C stops both."
wait "$agent"
