package discover

// Library names a CUDA or NCCL shared library by its unversioned soname.
type Library string

// The libraries discover recognises.
const (
	LibCudart Library = "libcudart.so" // CUDA runtime
	LibCuda   Library = "libcuda.so"   // CUDA driver
	LibNCCL   Library = "libnccl.so"   // NCCL
	// LibNVTX is NVTX: libnvToolsExt.so (NVTX v2) or libnvtx3interop.so
	// (the NVTX3 injection library). Only probed with
	// --enable-nvtx-tracing (Scanner.NVTX); the label of both is the
	// interface's "libnvtx3interop.so".
	LibNVTX Library = "libnvtx3interop.so"
	// LibLoader is the dynamic loader (ld.so): not profiled, but hooked so
	// that every library a process loads announces itself at once.
	LibLoader Library = "ld.so"
)

// loaders are the basenames of the dynamic loaders of glibc and musl.
var loaders = [...]string{"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "ld-musl-x86_64.so.1", "ld-musl-aarch64.so.1"}

// libraries lists the recognised libraries with the part of the basename
// between "lib" and ".so".
var libraries = [...]struct {
	stem string
	lib  Library
}{
	{"cudart", LibCudart},
	{"cuda", LibCuda},
	{"nccl", LibNCCL},
	{"nvToolsExt", LibNVTX},
	{"nvtx3interop", LibNVTX},
}

// Classify returns the library a mapped file belongs to, judged by the
// path's basename alone. The basename must be exactly lib<name>.so,
// optionally followed by one or more ".<digits>" groups: libcudart.so,
// libcudart.so.12 and libcudart.so.12.4.127 are LibCudart; libcuda.so.1 and
// libcuda.so.550.54.15 are LibCuda; libnccl.so.2 and libnccl.so.2.21.5 are
// LibNCCL; libnvToolsExt.so.1 and libnvtx3interop.so.1 are LibNVTX. Anything else is not: libcudart_static.a, libcudart.so.bak,
// libcudart.so.12. (empty group), libcudadebugger.so, libnccl-net.so,
// libcuda.so-foo, renamed copies such as libcudart-d0da41ae.so.11.0, and a
// path with a " (deleted)" suffix.
func Classify(path string) (Library, bool) {
	return classify(path)
}

// classify is Classify for both strings and byte slices, so the scanner can
// classify a line without converting it to a string.
func classify[T string | []byte](path T) (Library, bool) {
	base := path
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			base = path[i+1:]
			break
		}
	}
	for _, l := range loaders {
		if string(base) == l {
			return LibLoader, true
		}
	}
	if len(base) < len("lib.so") || string(base[:3]) != "lib" {
		return "", false
	}
	rest := base[3:]
	for _, l := range libraries {
		n := len(l.stem)
		if len(rest) < n+3 || string(rest[:n]) != l.stem || string(rest[n:n+3]) != ".so" {
			continue
		}
		if versionSuffix(rest[n+3:]) {
			return l.lib, true
		}
		return "", false
	}
	return "", false
}

// versionSuffix reports whether s is empty or a sequence of ".<digits>"
// groups, each with at least one digit.
func versionSuffix[T string | []byte](s T) bool {
	digits := 1 // digits in the current group; the empty suffix is fine
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if digits == 0 {
				return false
			}
			digits = 0
		case c >= '0' && c <= '9' && i > 0:
			digits++
		default:
			return false
		}
	}
	return digits > 0
}
