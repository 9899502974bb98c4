// Package gpu attributes calls to physical GPUs. The BPF programs put in
// every key the CUDA device ordinal the calling thread last set
// (cudaSetDevice), or none; a Labeler maps that process-local ordinal to
// the NVML index and UUID through the process's CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES (from /proc/PID/environ) and the NVML inventory.
// Without a cudaSetDevice it falls back to the GPU NVML lists the process
// on, then to the one /dev/nvidiaN it holds open, then to CUDA's default
// device (ordinal 0).
package gpu
