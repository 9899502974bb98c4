// Package discover finds processes that map CUDA and NCCL libraries.
//
// It owns everything that reads procfs for discovery:
//
//   - listing processes under an injectable procfs root (/proc, or /host/proc
//     when the agent runs in a container) and reading /proc/PID/maps, comm and
//     stat (Scanner, ListPIDs, Alive, ReadComm, ReadStartTime);
//   - parsing maps lines (ParseMapsLine) and recognising the CUDA runtime,
//     the CUDA driver and NCCL by a mapped file's basename (Classify);
//   - opening a mapped library file safely inside a process's root
//     (/proc/PID/root), so that a container cannot make the agent open a file
//     outside its own root through symlinks or magic links (OpenInRoot,
//     FileID).
//
// Discovery is read-only and cheap enough to run every few seconds on a node
// with thousands of processes: maps files are streamed through a pooled
// buffer, only lines whose basename looks like lib*.so* are fully parsed, and
// comm and stat are read only for processes that map a library.
//
// Per-process trouble never fails a scan: a process that exits mid-scan is
// skipped silently, and malformed lines, unreadable files and deleted library
// mappings are reported as Problems next to the result.
//
// The package must not attach anything: it knows nothing about BPF, uprobes
// or Prometheus, keeps no state between scans, and never writes to procfs or
// to a process's files.
//
// Parsing and classification are portable; scanning and opening need Linux
// and return an error wrapping errors.ErrUnsupported elsewhere.
package discover
