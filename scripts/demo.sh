#!/usr/bin/env bash
# `sudo make demo`, the tour: runs `profi check`, then profi against a stub
# CUDA workload that mimics an inference server (threads, streams,
# launches, copies, allocations, graph launches, a few errors), and opens
# `profi top` on them. q (or Ctrl-C) stops everything.
# PROFI_DEMO_NO_TOP=1 prints the periodic report table instead of top.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "profi demo: loading BPF needs root; run: sudo make demo" >&2
	exit 1
fi
listen=${PROFI_DEMO_LISTEN:-127.0.0.1:9401}
dir=$(go run ./test/fixtures bin/demo)
log=$(mktemp -t profi-demo.XXXXXX)

echo "== profi check (preflight) =="
bin/profi check --disable-nvml || echo "(profi check found problems: the demo may not work)"
echo

# The workload runs one measured phase per "go" line: one per second.
(while sleep 1; do echo go; done) | "$dir/workload" --threads 2 --iters 500 >/dev/null &
workload=$!
report=()
if [ -n "${PROFI_DEMO_NO_TOP:-}" ]; then report=(--report-interval 2); fi
bin/profi --listen "$listen" --refresh-interval 1 --disable-nvml --cudart "$dir/libcudart.so.12" "${report[@]}" >"$log" 2>&1 &
agent=$!

stop() {
	trap - INT TERM EXIT
	kill "$agent" 2>/dev/null || true
	kill "$workload" 2>/dev/null || true
	wait 2>/dev/null || true
	echo "profi demo stopped (agent log: $log)."
}
trap stop INT TERM EXIT

echo "profi demo: workload pid $workload, agent pid $agent"
echo "  metrics: curl -s http://$listen/metrics | grep ^profi_cuda"
echo "  explain: bin/profi explain --agent http://$listen $workload"
for _ in $(seq 100); do # until the agent listens (bash's /dev/tcp: no curl needed)
	(exec 3<>"/dev/tcp/${listen%:*}/${listen##*:}") 2>/dev/null && break
	sleep 0.1
done
if [ -n "${PROFI_DEMO_NO_TOP:-}" ] || [ ! -t 1 ]; then
	tail -f "$log" &
	wait "$agent"
else
	sleep 2 # one discovery pass: the workload is attached
	bin/profi explain --agent "http://$listen" "$workload" || true
	echo
	read -r -t 5 -p "press Enter for profi top (q quits) " _ || true
	bin/profi top --agent "http://$listen" --interval 1s
fi
