package discover

import "errors"

// Mapping is one CUDA/NCCL library file mapped by a process.
type Mapping struct {
	PID   int
	Lib   Library
	Path  string // path as printed in maps: inside the process's mount namespace
	Dev   uint64 // st_dev encoded with unix.Mkdev(major, minor) from the maps "dev" field
	Inode uint64
	// TextStart and TextEnd are the first executable mapping of the file
	// (0, 0 if none yet): where its code runs in this process.
	TextStart, TextEnd uint64
	// Static marks the process's executable reported as a possible
	// statically linked CUDA runtime (Lib is LibCudart): the process maps
	// the driver but no libcudart.so, as nvcc's default -cudart static,
	// NCCL and TensorRT-LLM builds do. Its runtime functions, if any, are in
	// .dynsym or, unstripped, .symtab.
	Static bool
}

// Process is what a scan learned about one process.
type Process struct {
	PID       int
	Comm      string    // /proc/PID/comm of the thread-group leader, without the newline
	StartTime uint64    // field 22 of /proc/PID/stat (clock ticks since boot), to tell a reused PID apart
	Libs      []Mapping // distinct (Dev, Inode, Lib), in maps order; deleted files are skipped
	// TracerPID is the TracerPid of /proc/PID/status (0: none), read only
	// with Scanner.Tracers.
	TracerPID int
}

// Problem is a non-fatal, per-process problem met during a scan: a malformed
// or overlong maps line, an unreadable file, a deleted library mapping.
type Problem struct {
	PID int
	Err error
}

// Result is the outcome of one scan.
type Result struct {
	Processes []Process // only processes that map at least one CUDA/NCCL library or a dynamic loader, sorted by PID
	Scanned   int       // processes whose maps were looked at (processes that vanished before are not counted)
	Problems  []Problem
}

// Scanner scans procfs for processes mapping CUDA/NCCL libraries. The zero
// value scans every process under /proc. A Scanner holds no state between
// scans, and Scan may be called from several goroutines at once.
type Scanner struct {
	ProcRoot string // procfs root, e.g. "/proc" or "/host/proc"; "" means "/proc"
	PID      int    // 0 = all processes; otherwise only this PID is read (no directory listing)
	// NVTX reports NVTX libraries (LibNVTX) too (--enable-nvtx-tracing);
	// off, they are not libraries of interest.
	NVTX bool
	// Tracers reads each reported process's TracerPid (Process.TracerPID):
	// --probe-traced-processes leaves traced processes unprobed.
	Tracers bool
}

// DefaultProcRoot is used where a procfs root is "".
const DefaultProcRoot = "/proc"

var (
	// ErrProcessGone is wrapped by errors about a process that no longer
	// exists (or has exited and is a zombie).
	ErrProcessGone = errors.New("process gone")
	// ErrUnsafePath is wrapped by OpenInRoot errors about a path that could
	// not be resolved safely inside the process's root: a relative path, a
	// magic link (e.g. /proc/self/root) on the way, a symlink loop, or a file
	// that changed while it was being opened.
	ErrUnsafePath = errors.New("unsafe path")
	// ErrNotRegular is wrapped by OpenInRoot errors about a path that
	// resolves to something other than a regular file (directory, device,
	// FIFO, socket).
	ErrNotRegular = errors.New("not a regular file")
	// ErrDeletedLibrary is wrapped by the scan Problem reported, once per
	// process and file, for a CUDA/NCCL library mapped from a deleted file.
	ErrDeletedLibrary = errors.New("library mapped from a deleted file")
)

func procRootOr(root string) string {
	if root == "" {
		return DefaultProcRoot
	}
	return root
}
