// Package kernelname turns what the agent learns about a CUDA kernel into
// the label values of docs/INTERFACE.md §5.2: `kernel`, `kernel_class` and
// `phase`.
//
// It owns:
//
//   - normalization of kernel names (Normalize): a real Itanium C++
//     demangler, then template arguments, parameter lists, qualifiers and a
//     leading return type stripped, a Triton `_<digits>` suffix dropped, the
//     result cut to 64 bytes of valid UTF-8;
//   - the substring tables for `kernel_class` (Class) and the NVTX `phase`
//     (Phase), and the `unknown_0x…` placeholder (Unknown);
//   - reading a NUL-terminated name out of a live process through
//     /proc/PID/mem (ReadString), with typed errors whose Reason is the
//     `reason` label of profi_system_kernel_name_resolve_failures_total;
//   - the ELF symbol fallback (Symbolizer) for processes whose kernels were
//     registered before the agent started: a runtime address is mapped to
//     its file through /proc/PID/maps, the file offset to an ELF virtual
//     address through the PT_LOAD program headers, and the address to the
//     FUNC symbol containing it. Files are read through internal/elfsym,
//     whose caps bound what a crafted file costs. Parsed symbol tables
//     are cached per (dev, inode) of the mapped file.
//
// The package must not load or read BPF objects, attach probes, or touch
// Prometheus: it returns strings and errors, and callers count and export
// them. It never writes to procfs or to a process's memory or files, and
// mapped files are opened only through discover.OpenInRoot (or, for a
// deleted file, /proc/PID/map_files), so a container cannot redirect the
// agent to a file outside its root.
//
// Normalize, Class, Phase and Unknown are pure and portable. ReadString and
// Symbolizer read procfs and so only work on Linux; elsewhere they return
// errors.
package kernelname
