package bpfobj

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-14 -strip llvm-strip-14 -target amd64 -type agg_key -type agg_val -type launch_key -type launch_val -type inflight_call -type alloc_key -type alloc_val -type pid_file -type claim_key -type text_range -type nccl_key -type nccl_val -type nccl_call -type nccl_comm_key -type nccl_comm -type nvtx_ranges -type graph_node_key -type graph_node_val -type replay_key -type handle_key -type pid_quota Profi ../../bpf/profi.bpf.c -- -I../../bpf -O2 -mcpu=v3 -g -Wall -Werror
