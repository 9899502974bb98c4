// Package bpfobj owns profi's BPF object: the bpf2go output generated from
// bpf/profi.bpf.c, the Go names of its operations and drop counters, and
// Load, which sizes the maps from the configuration and loads everything
// into the kernel.
//
// It must not attach probes (package attach does) nor read maps on a
// schedule (package aggregate does). The generated *_bpfel.go/.o files are
// committed, so `go build` needs no clang; `make generate` rebuilds them.
package bpfobj
