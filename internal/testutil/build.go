// Package testutil builds and drives the GPU-free test fixtures: stub
// libcudart.so.12 and libcuda.so.1 with the real CUDA Runtime and Driver
// symbols and ABI (the runtime calling into the driver, as the real one
// does), libnccl.so.2 with NCCL's, an NVTX library (libnvToolsExt.so.1 and
// libnvtx3interop.so.1), a workload that calls the CUDA and NVTX stubs and an
// NCCL workload (one process per rank), both reporting exact ground truth.
package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// ErrNoCompiler is returned (wrapped) by BuildFixtures and CC when the C compiler is not in PATH.
var ErrNoCompiler = errors.New("no C compiler in PATH: it is needed to build the CUDA stubs and workloads")

// Compiler flags. The stub's are fixed on purpose: together with the source
// they decide each exported function's first instruction ("push %rbp"), and
// that decides how the kernel executes a uprobe placed there, hence probe
// cost. -fno-ipa-icf keeps identical bodies at distinct addresses, so every
// symbol is its own probe site. All stubs use them; only the SONAME
// differs. Warning flags do not change code generation. -rdynamic puts the
// workload's kernel host stubs in .dynsym, where symbolizers look first.
var (
	stubFlags = []string{
		"-O2", "-fno-omit-frame-pointer", "-fno-ipa-icf",
		"-fno-inline", "-shared", "-fPIC",
	}
	workloadFlags = []string{"-O2", "-pthread", "-rdynamic"}
	warnFlags     = []string{"-Wall", "-Wextra", "-Werror"}
)

// archFlags are the stub flags of one architecture (after Compiler.Flags):
// stub adds to every stub; hardened builds CudartCET; locked builds the
// CudartLocked variants, whose refused entries cannot be BTI landing pads.
//
// arm64's hardened build is BTI-marked (GNU property note), so the loader
// maps its code guarded: an indirect branch to anything but a landing pad
// (bti c, paciasp) or a breakpoint faults. Every input must carry the note,
// or the marked library would hold unmarked code that the loader calls
// indirectly: no crt files (-nostartfiles: their _init and frame_dummy
// have no landing pads in Debian's cross toolchain) and no libgcc atomics
// helpers (-mno-outline-atomics: lse-init is an unmarked constructor).
var archFlags = map[string]struct{ stub, hardened, locked []string }{
	"amd64": {stub: []string{"-fcf-protection=none"}, hardened: []string{"-fcf-protection=full"}},
	"arm64": {
		hardened: []string{"-mno-outline-atomics", "-nostartfiles", "-Wl,-z,force-bti"},
		locked:   []string{"-mbranch-protection=none"},
	},
}

// Source files, relative to the repository root.
const (
	stubSrc     = "test/stubs/cudart.c"
	stubHeader  = "test/stubs/cuda_stub.h"
	cudaSrc     = "test/stubs/cuda.c"
	cudaHeader  = "test/stubs/cuda_drv_stub.h"
	workloadSrc = "test/workloads/workload.c"

	ncclSrc         = "test/stubs/nccl.c"
	ncclHeader      = "test/stubs/nccl_stub.h"
	nvtxSrc         = "test/stubs/nvtx.c"
	nvtxHeader      = "test/stubs/nvtx_stub.h"
	ncclWorkloadSrc = "test/workloads/nccl_workload.c"
	launch13Src     = "test/workloads/launch13.c"
	drvapiSrc       = "test/workloads/drvapi.c"
	rtclientSrc     = "test/workloads/rtclient.c"
	graphsSrc       = "test/workloads/graphs.c"
	hostileStubSrc  = "test/stubs/hostile_cudart.c"
	hostileSrc      = "test/workloads/hostile.c"
	tracerSrc       = "test/workloads/tracer.c"
	cudart12Map     = "test/stubs/libcudart.so.12.map"
	cudart13Map     = "test/stubs/libcudart.so.13.map"
)

// Fixtures holds paths of built fixtures.
type Fixtures struct {
	Dir           string // build dir (absolute)
	Cuda          string // <dir>/libcuda.so.1, the stub driver
	Cudart        string // <dir>/libcudart.so.12: NEEDED libcuda.so.1, RUNPATH <dir>
	CudartMissing string // <dir>/missing/libcudart.so.12 (no graph symbols; same driver)
	// CudartCET is built with -fcf-protection=full: every function starts
	// with endbr64 then push %rbp, as in CET-hardened distribution builds.
	// On arm64 it is the BTI-marked build (archFlags): its code is mapped
	// guarded where the CPU has BTI.
	CudartCET    string // <dir>/cet/libcudart.so.12
	CudartNotELF string // <dir>/notelf/libcudart.so.12 (a text file)
	// CudartLocked's cudaGraphLaunch starts with "lock xadd %ecx, <global>":
	// the kernel refuses a uprobe there, and the instruction writes an
	// argument register, so no probe may move past it.
	CudartLocked string // <dir>/locked/libcudart.so.12
	// CudartLockedMovable's cudaGraphLaunch starts with "lock incl
	// <global>" (7 bytes), refused too, but it changes no register: the
	// probe may go on the next instruction.
	CudartLockedMovable string // <dir>/locked-movable/libcudart.so.12
	Workload            string // linked against Cudart, found through its RUNPATH; the driver through Cudart's
	WorkloadDlopen      string // dlopens the library given by --lib (and --lib-cuda for --driver)

	// Nccl's API names are weak symbols with global pnccl* aliases at the
	// same addresses, as in NVIDIA's builds.
	Nccl         string // <dir>/libnccl.so.2, the stub NCCL
	NcclWorkload string // one rank (testutil.StartNCCL); NEEDED libnccl.so.2 and libcudart.so.12, RUNPATH <dir>
	// The same NVTX stub under both names; the workloads dlopen it only with --nvtx.
	Nvtx         string // <dir>/libnvToolsExt.so.1
	Nvtx3Interop string // <dir>/libnvtx3interop.so.1
	// Cudart13 models CUDA 13.0's runtime: the CUDA 13 launch entry points
	// (__cudaGetKernel, __cudaLaunchKernel[_ptsz]), every export versioned
	// libcudart.so.13. Cudart (libcudart.so.12) lacks them, as CUDA 12 does.
	Cudart13 string // <dir>/cuda13/libcudart.so.13
	// Launch13 launches as nvcc 13 code does (__cudaGetKernel, then
	// __cudaLaunchKernel[_ptsz] from __device_stub_ functions); NEEDED
	// libcudart.so.13, RUNPATH <dir>/cuda13:<dir>.
	Launch13 string
	// Launch13Static is Launch13 with the CUDA 13 runtime linked into the
	// executable (nvcc's default -cudart static): no libcudart.so mapped,
	// the runtime's functions in .symtab only; NEEDED libcuda.so.1.
	Launch13Static string
	// Launch13Stripped is Launch13Static stripped (-s): the static runtime
	// is invisible, only the driver below it can be probed.
	Launch13Stripped string
	// DrvAPI calls the driver API directly, memory and launches (Triton,
	// NCCL, static runtimes); NEEDED libcuda.so.1, RUNPATH <dir>.
	DrvAPI string
	// RTClient dlopens a runtime by path (NVIDIA's libcudart.so.11.8 in
	// the tests) and calls every probed runtime function; dlopens nothing else.
	RTClient string
	// Graphs uses CUDA graphs as PyTorch and vLLM do (capture with a
	// fork/join, one graph per batch size, replays, exec updates, failed
	// captures, graphs built node by node) through the runtime, CUDA 13's
	// __cudaLaunchKernel and the driver; NEEDED libcudart.so.13 and
	// libcuda.so.1, RUNPATH <dir>/cuda13:<dir>.
	Graphs string
	// HostileCudart is a hostile tenant's own libcudart.so.12 (issue 17
	// item 3): copies return any code the process sets, allocations hand
	// out fake pointers. Hostile (linked against it, RUNPATH its dir)
	// calls it with thousands of stream handles, return codes and live
	// allocations, to fill profi's shared maps.
	HostileCudart string // <dir>/hostile/libcudart.so.12
	Hostile       string
	// Tracer is a minimal ptrace tracer (test/workloads/tracer.c): runs a
	// command traced, or attaches to a process and detaches on SIGTERM.
	Tracer string
}

func fixturesIn(dir string) *Fixtures {
	return &Fixtures{
		Dir:                 dir,
		Cuda:                filepath.Join(dir, "libcuda.so.1"),
		Cudart:              filepath.Join(dir, "libcudart.so.12"),
		CudartMissing:       filepath.Join(dir, "missing", "libcudart.so.12"),
		CudartCET:           filepath.Join(dir, "cet", "libcudart.so.12"),
		CudartNotELF:        filepath.Join(dir, "notelf", "libcudart.so.12"),
		CudartLocked:        filepath.Join(dir, "locked", "libcudart.so.12"),
		CudartLockedMovable: filepath.Join(dir, "locked-movable", "libcudart.so.12"),
		Workload:            filepath.Join(dir, "workload"),
		WorkloadDlopen:      filepath.Join(dir, "workload-dlopen"),
		Nccl:                filepath.Join(dir, "libnccl.so.2"),
		NcclWorkload:        filepath.Join(dir, "nccl-workload"),
		Nvtx:                filepath.Join(dir, "libnvToolsExt.so.1"),
		Nvtx3Interop:        filepath.Join(dir, "libnvtx3interop.so.1"),
		Cudart13:            filepath.Join(dir, "cuda13", "libcudart.so.13"),
		Launch13:            filepath.Join(dir, "launch13"),
		Launch13Static:      filepath.Join(dir, "launch13-static"),
		Launch13Stripped:    filepath.Join(dir, "launch13-stripped"),
		DrvAPI:              filepath.Join(dir, "drvapi"),
		RTClient:            filepath.Join(dir, "rtclient"),
		Graphs:              filepath.Join(dir, "graphs"),
		HostileCudart:       filepath.Join(dir, "hostile", "libcudart.so.12"),
		Hostile:             filepath.Join(dir, "hostile-workload"),
		Tracer:              filepath.Join(dir, "tracer"),
	}
}

func (f *Fixtures) all() []string {
	return []string{f.Cuda, f.Cudart, f.CudartMissing, f.CudartCET, f.CudartNotELF, f.Workload, f.WorkloadDlopen,
		f.Nccl, f.NcclWorkload, f.Nvtx, f.Nvtx3Interop, f.Cudart13, f.Launch13, f.Launch13Static,
		f.Launch13Stripped, f.DrvAPI, f.RTClient, f.CudartLocked, f.CudartLockedMovable, f.Graphs,
		f.HostileCudart, f.Hostile, f.Tracer}
}

// SharedDir is a per-user build directory under os.TempDir for fixtures
// shared by several test binaries; BuildFixtures makes sharing it safe.
func SharedDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("profi-fixtures-%d", os.Getuid()))
}

// BuildFixtures compiles the stubs and workloads for the host's
// architecture into dir (BuildFixturesFor).
func BuildFixtures(dir string) (*Fixtures, error) {
	return BuildFixturesFor(runtime.GOARCH, dir)
}

// BuildFixturesFor compiles the stubs and workloads for goarch with its C
// compiler (CC) into dir (created if needed). It is safe to call concurrently on one dir, from goroutines or
// processes: builds are serialised by a lock file, and skipped when a stamp
// shows the outputs already match the sources, flags and compiler. Skipping
// matters beyond speed: replacing a library gives it a new inode, and uprobes
// attached through the old one would silently stop firing for new processes.
func BuildFixturesFor(goarch, dir string) (*Fixtures, error) {
	cc, err := CC(goarch)
	if err != nil {
		return nil, err
	}
	af := archFlags[goarch]
	stubFlags := cat(af.stub, stubFlags) // -shared -fPIC stay last (launch13Static drops them)
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	// Absolute, because the linked workload's RUNPATH records it.
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	fx := fixturesIn(dir)

	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	stamp, err := buildStamp(cc, stubFlags, root, dir)
	if err != nil {
		return nil, err
	}
	stampPath := filepath.Join(dir, ".stamp")
	if old, err := os.ReadFile(stampPath); err == nil && string(old) == stamp && allExist(fx.all()) {
		return fx, nil
	}

	// Build in a private directory and rename into place, so a reader never
	// sees a half-written file.
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	defer os.RemoveAll(tmp)
	t := fixturesIn(tmp)
	for _, d := range []string{filepath.Dir(t.CudartMissing), filepath.Dir(t.CudartCET), filepath.Dir(t.CudartNotELF), filepath.Dir(t.Cudart13),
		filepath.Dir(t.CudartLocked), filepath.Dir(t.CudartLockedMovable), filepath.Dir(t.HostileCudart)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("testutil: %w", err)
		}
	}
	if err := os.WriteFile(t.CudartNotELF, []byte("not an ELF file: a fake libcudart.so.12 for tests\n"), 0o644); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}

	src := func(rel string) string { return filepath.Join(root, rel) }
	incl := "-I" + filepath.Join(root, filepath.Dir(stubHeader)) // workloads include the stub headers
	var builds [][]string
	// The runtime stubs link against the driver stub being built, but
	// record the final dir, where they find libcuda.so.1 at run time.
	cudart := func(out string, extra ...string) []string {
		return cat(stubFlags, warnFlags, []string{"-Wl,-soname,libcudart.so.12", "-Wl,--version-script," + src(cudart12Map)}, extra,
			[]string{"-o", out, src(stubSrc), "-lpthread", "-L" + tmp, "-l:libcuda.so.1", "-Wl,-rpath," + dir})
	}
	// The static runtime: the stub's code compiled into the executable with
	// the stub's code-generation flags (not -shared), the driver linked.
	launch13Static := func(out string, extra ...string) []string {
		return cat(stubFlags[:len(stubFlags)-2], warnFlags, []string{"-pthread", "-DPROFI_CUDART_MAJOR=13", incl},
			extra, []string{"-o", out, src(launch13Src), src(stubSrc), "-L" + tmp, "-l:libcuda.so.1",
				"-Wl,-rpath," + dir, "-Wl,-rpath-link," + tmp})
	}
	builds = append(builds,
		cat(stubFlags, warnFlags, []string{"-Wl,-soname,libcuda.so.1", "-o", t.Cuda, src(cudaSrc), "-lpthread"}),
		cudart(t.Cudart),
		cudart(t.CudartMissing, "-DPROFI_STUB_OMIT_GRAPH"),
		cudart(t.CudartCET, af.hardened...), // overrides stubFlags' none
		cudart(t.CudartLocked, cat([]string{"-DPROFI_STUB_LOCKED_GRAPH=2"}, af.locked)...),
		cudart(t.CudartLockedMovable, cat([]string{"-DPROFI_STUB_LOCKED_GRAPH=1"}, af.locked)...),
		// Likewise; -rpath-link makes ld check Cudart's NEEDED against the
		// new driver, not whatever the final dir holds.
		cat(workloadFlags, warnFlags, []string{incl, "-o", t.Workload, src(workloadSrc),
			"-L" + tmp, "-l:libcudart.so.12", "-Wl,-rpath," + dir, "-Wl,-rpath-link," + tmp, "-ldl"}),
		cat(workloadFlags, warnFlags, []string{"-DPROFI_DLOPEN", incl, "-o", t.WorkloadDlopen,
			src(workloadSrc), "-ldl"}),
		cat(stubFlags, warnFlags, []string{"-Wl,-soname,libnccl.so.2", "-o", t.Nccl, src(ncclSrc), "-lpthread"}),
		cat(stubFlags, warnFlags, []string{"-Wl,-soname,libnvToolsExt.so.1", "-o", t.Nvtx, src(nvtxSrc), "-lpthread"}),
		cat(stubFlags, warnFlags, []string{"-Wl,-soname,libnvtx3interop.so.1", "-o", t.Nvtx3Interop, src(nvtxSrc), "-lpthread"}),
		cat(stubFlags, warnFlags, []string{"-DPROFI_CUDART_MAJOR=13", "-Wl,-soname,libcudart.so.13",
			"-Wl,--version-script," + src(cudart13Map), "-o", t.Cudart13, src(stubSrc), "-lpthread",
			"-L" + tmp, "-l:libcuda.so.1", "-Wl,-rpath," + dir}),
		cat(workloadFlags, warnFlags, []string{incl, "-o", t.Launch13, src(launch13Src),
			"-L" + filepath.Dir(t.Cudart13), "-l:libcudart.so.13", "-Wl,-rpath," + filepath.Dir(fx.Cudart13) + ":" + dir,
			"-Wl,-rpath-link," + tmp}),
		launch13Static(t.Launch13Static),
		launch13Static(t.Launch13Stripped, "-s"),
		cat(workloadFlags, warnFlags, []string{incl, "-o", t.RTClient, src(rtclientSrc), "-ldl"}),
		cat(workloadFlags, warnFlags, []string{incl, "-o", t.Graphs, src(graphsSrc),
			"-L" + filepath.Dir(t.Cudart13), "-l:libcudart.so.13", "-L" + tmp, "-l:libcuda.so.1",
			"-Wl,-rpath," + filepath.Dir(fx.Cudart13) + ":" + dir, "-Wl,-rpath-link," + tmp}),
		cat(workloadFlags, warnFlags, []string{incl, "-o", t.DrvAPI, src(drvapiSrc),
			"-L" + tmp, "-l:libcuda.so.1", "-Wl,-rpath," + dir, "-Wl,-rpath-link," + tmp}),
		cat(stubFlags, warnFlags, []string{"-Wl,-soname,libcudart.so.12", "-o", t.HostileCudart, src(hostileStubSrc)}),
		cat(workloadFlags, warnFlags, []string{"-o", t.Hostile, src(hostileSrc), "-L" + filepath.Dir(t.HostileCudart),
			"-l:libcudart.so.12", "-Wl,-rpath," + filepath.Dir(fx.HostileCudart)}),
		cat(workloadFlags, warnFlags, []string{"-o", t.Tracer, src(tracerSrc)}),
		// Like a PyTorch rank: NCCL and the CUDA runtime, both linked.
		cat(workloadFlags, warnFlags, []string{incl, "-o", t.NcclWorkload, src(ncclWorkloadSrc),
			"-L" + tmp, "-l:libnccl.so.2", "-l:libcudart.so.12", "-Wl,-rpath," + dir, "-Wl,-rpath-link," + tmp}),
	)
	for _, args := range builds {
		cmd := cc.Command(args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("testutil: %s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
		}
	}

	for _, d := range []string{filepath.Dir(fx.CudartMissing), filepath.Dir(fx.CudartCET), filepath.Dir(fx.CudartNotELF), filepath.Dir(fx.Cudart13),
		filepath.Dir(fx.CudartLocked), filepath.Dir(fx.CudartLockedMovable), filepath.Dir(fx.HostileCudart)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("testutil: %w", err)
		}
	}
	from, to := t.all(), fx.all()
	for i := range from {
		if err := os.Rename(from[i], to[i]); err != nil {
			return nil, fmt.Errorf("testutil: %w", err)
		}
	}
	// The stamp goes last: an interrupted build is redone next time.
	if err := os.WriteFile(filepath.Join(tmp, ".stamp"), []byte(stamp), 0o644); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, ".stamp"), stampPath); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	return fx, nil
}

// lockDir takes an exclusive flock on dir/.lock; flock locks belong to the
// open file, so this serialises goroutines of one process as well.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("testutil: lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// buildStamp hashes everything the outputs depend on.
func buildStamp(cc Compiler, stubFlags []string, root, dir string) (string, error) {
	h := sha256.New()
	ver, err := exec.Command(cc.Path, "-dumpfullversion", "-dumpversion").Output()
	if err != nil {
		return "", fmt.Errorf("testutil: %s -dumpfullversion: %w", cc.Path, err)
	}
	fmt.Fprintf(h, "%s\n%q\n%s\n%s\n%q\n%q\n%q\n%v\n", cc.Path, cc.Flags, ver, dir, stubFlags, workloadFlags, warnFlags, archFlags[cc.GOARCH])
	for _, rel := range []string{stubSrc, stubHeader, cudaSrc, cudaHeader, workloadSrc,
		ncclSrc, ncclHeader, nvtxSrc, nvtxHeader, ncclWorkloadSrc, launch13Src, drvapiSrc, rtclientSrc, graphsSrc,
		cudart12Map, cudart13Map, hostileStubSrc, hostileSrc, tracerSrc} {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", fmt.Errorf("testutil: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func allExist(paths []string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// CopyFile copies from to to, executable (a library or program copy
// under a name or inode of the test's own).
func CopyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
