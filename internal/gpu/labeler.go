package gpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/nvml"
)

// Sources of an attribution, shown in /status.
const (
	// SourceSetDevice: the calling thread set the device with cudaSetDevice.
	SourceSetDevice = "cudaSetDevice"
	// The thread never set one; then, in this order:
	// SourceNVMLProcess: NVML lists the process on exactly one GPU.
	SourceNVMLProcess = "nvml_process"
	// SourceDeviceFile: the process holds exactly one /dev/nvidiaN open.
	SourceDeviceFile = "device_file"
	// SourceDefault: CUDA's default device, ordinal 0 of the visible list.
	SourceDefault = "default"
)

// maxEnviron bounds how much of /proc/PID/environ is read.
const maxEnviron = 4 << 20

// Labeler maps the device of a call (a process-local CUDA ordinal from the
// BPF keys, or bpfobj.DevNone) to the gpu and gpu_uuid labels: the NVML
// index and UUID of the physical GPU. It implements aggregate.GPULabeler and
// is safe for concurrent use.
type Labeler struct {
	// ProcRoot is the procfs mount ("" = /proc).
	ProcRoot string
	// NVML returns the latest NVML snapshot; nil when NVML is disabled.
	NVML func() *nvml.Snapshot

	mu    sync.Mutex
	procs map[int]*proc
	// rejected counts environment entries that could not be labels
	// (rejectedEntries), once per process.
	rejected atomic.Uint64
}

// proc is what is known about one process: the one that started at start,
// so a new process that reuses the PID starts afresh.
type proc struct {
	start    uint64
	env      *environ
	resolved map[uint32]Attribution // final answers, by device
}

// environ holds the two variables that choose a process's GPUs; nil: unset.
type environ struct{ cuda, nvidia *string }

// Attribution is the GPU of one device of a process and how it was found.
type Attribution struct {
	Device Device
	Source string
}

// GPU returns the labels of device dev (a CUDA ordinal, or bpfobj.DevNone)
// of process pid that started at start (field 22 of its stat), and the
// source of the answer.
func (l *Labeler) GPU(pid int, start uint64, dev uint32) (gpu, uuid, source string) {
	a := l.Attribute(pid, start, dev)
	gpu, uuid = a.Device.Labels()
	return gpu, uuid, a.Source
}

// Rejected counts the entries of processes' CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES that were not believed (malformed UUIDs, over-long
// values), once per process.
func (l *Labeler) Rejected() uint64 { return l.rejected.Load() }

// Attribute resolves device dev of pid, the process that started at start.
// An answer is kept until Forget (or until another process has the PID)
// once NVML has answered (or is disabled), so a series never moves later;
// before, it is recomputed on every call.
func (l *Labeler) Attribute(pid int, start uint64, dev uint32) Attribution {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.procs == nil {
		l.procs = map[int]*proc{}
	}
	p := l.procs[pid]
	if p == nil || p.start != start {
		p = &proc{start: start, resolved: map[uint32]Attribution{}}
		l.procs[pid] = p
	}
	if a, ok := p.resolved[dev]; ok {
		return a
	}
	var snap *nvml.Snapshot
	if l.NVML != nil {
		snap = l.NVML()
	}
	gpus := inventory(snap)
	// Every file of the answer is read through one pinned /proc/PID of
	// the process that started at start: a recycled PID fails the reads
	// instead of lending another process's environment or devices.
	pd, err := discover.OpenProc(l.root(), pid, start)
	if err != nil {
		// Gone, reused, or unreadable: answer without, ask again next time.
		return Attribution{Device: Device{Index: -1}, Source: sourceOf(dev)}
	}
	defer pd.Close()
	if p.env == nil {
		env, err := readEnviron(pd)
		if err != nil {
			return Attribution{Device: Device{Index: -1}, Source: sourceOf(dev)}
		}
		p.env = env
		l.rejected.Add(rejectedEntries(env.cuda, env.nvidia))
	}
	vis := visible(p.env.cuda, p.env.nvidia, gpus)
	a := l.resolve(pd, dev, vis, gpus)
	if l.NVML == nil || gpus != nil {
		p.resolved[dev] = a
	}
	return a
}

func sourceOf(dev uint32) string {
	if dev == bpfobj.DevNone {
		return SourceDefault
	}
	return SourceSetDevice
}

// resolve answers for one device; see the Source constants for the order.
func (l *Labeler) resolve(pd *discover.Proc, dev uint32, vis list, gpus []nvml.GPU) Attribution {
	if dev != bpfobj.DevNone {
		d, ok := vis.ordinal(int(dev))
		if !ok {
			d = Device{Index: -1}
		}
		return Attribution{Device: l.held(pd, d, gpus), Source: SourceSetDevice}
	}
	if d, ok := nvmlProcessDevice(pd.PID(), gpus); ok {
		return Attribution{Device: d, Source: SourceNVMLProcess}
	}
	if minors := deviceFiles(pd); len(minors) == 1 {
		return Attribution{Device: minorDevice(minors[0], gpus), Source: SourceDeviceFile}
	}
	d, ok := vis.ordinal(0)
	if !ok {
		d = Device{Index: -1}
	}
	return Attribution{Device: l.held(pd, d, gpus), Source: SourceDefault}
}

// held checks a device the process's environment named against the GPUs
// whose /dev/nvidiaN it holds open (CUDA opens those of every visible GPU
// when it initialises): the process writes its environment, so without
// this it could label its series with any GPU of the node (issue 30). A
// device it does not hold is not believed (counted in Rejected). Only
// with NVML (minor numbers to map the files); a process that holds no
// GPU device file cannot be checked. NVML's process list is not used: it
// is as old as the last poll, and the answer is kept.
func (l *Labeler) held(pd *discover.Proc, d Device, gpus []nvml.GPU) Device {
	if gpus == nil || d.Index < 0 {
		return d
	}
	minors := deviceFiles(pd)
	if len(minors) == 0 {
		return d
	}
	for _, m := range minors {
		if minorDevice(m, gpus).Index == d.Index {
			return d
		}
	}
	l.rejected.Add(1)
	return Device{Index: -1}
}

// Forget drops what is known about an exited process.
func (l *Labeler) Forget(pid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.procs, pid)
}

func (l *Labeler) root() string {
	if l.ProcRoot == "" {
		return "/proc"
	}
	return l.ProcRoot
}

// nvmlProcessDevice is the one GPU (or MIG device) NVML lists pid on.
func nvmlProcessDevice(pid int, gpus []nvml.GPU) (Device, bool) {
	var found []Device
	for _, g := range gpus {
		for _, p := range g.Processes {
			if int(p.PID) != pid {
				continue
			}
			if len(p.MIGUUIDs) == 1 {
				found = append(found, Device{Index: g.Index, UUID: p.MIGUUIDs[0]})
			} else {
				found = append(found, Device{Index: g.Index, UUID: g.UUID})
			}
		}
	}
	if len(found) != 1 {
		return Device{}, false
	}
	return found[0], true
}

// minorDevice is the GPU of device file /dev/nvidiaN: the GPU whose NVML
// minor number is N; without NVML (or without minor numbers), GPU N, which
// is the NVML index on most machines but not guaranteed.
func minorDevice(minor int, gpus []nvml.GPU) Device {
	for _, g := range gpus {
		if g.Minor != nil && *g.Minor == minor {
			return Device{Index: g.Index, UUID: g.UUID}
		}
	}
	for _, g := range gpus {
		if g.Minor == nil && g.Index == minor {
			return Device{Index: g.Index, UUID: g.UUID}
		}
	}
	if gpus != nil {
		return Device{Index: -1}
	}
	return Device{Index: minor}
}

// DeviceFiles returns the minor numbers N of the /dev/nvidiaN files pid
// holds open, sorted and distinct (nvidiactl, nvidia-uvm and the like are
// not GPUs). The container toolkit keeps the host's device names.
func DeviceFiles(procRoot string, pid int) []int {
	pd, err := discover.OpenProc(procRoot, pid, 0)
	if err != nil {
		return nil
	}
	defer pd.Close()
	return deviceFiles(pd)
}

func deviceFiles(pd *discover.Proc) []int {
	targets, err := pd.FDTargets()
	if err != nil {
		return nil
	}
	seen := map[int]bool{}
	var out []int
	for _, target := range targets {
		n, ok := strings.CutPrefix(target, "/dev/nvidia")
		if !ok || !isDigits(n) {
			continue
		}
		if m, err := strconv.Atoi(n); err == nil && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	sort.Ints(out)
	return out
}

// readEnviron reads CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES from
// /proc/PID/environ: the environment the process started with (a variable
// the process sets itself later, e.g. in Python before importing torch, is
// not seen).
//
// The environment is streamed (issue 30, docs/SECURITY.md): a huge one
// costs a small fixed buffer and at most one variable's first
// maxVisibleLen+1 bytes, never its size.
func readEnviron(pd *discover.Proc) (*environ, error) {
	f, err := pd.Open("environ")
	if err != nil {
		return nil, fmt.Errorf("read environment: %w", err)
	}
	defer f.Close()
	env, err := scanEnviron(io.LimitReader(f, maxEnviron))
	if err != nil {
		return nil, fmt.Errorf("read environment of pid %d: %w", pd.PID(), err)
	}
	return env, nil
}

// parseEnviron extracts the two variables from a NUL-separated environment.
func parseEnviron(b []byte) *environ {
	env, _ := scanEnviron(bytes.NewReader(b)) // a bytes.Reader fails only at EOF
	return env
}

// envKeep is how much of one variable is kept: the longer name, "=", and
// one byte more than a value that can be believed.
const envKeep = len("NVIDIA_VISIBLE_DEVICES=") + maxVisibleLen + 1

// scanEnviron reads NUL-separated variables and keeps the two that choose
// a process's GPUs (the last of each, as before); memory is bounded by the
// reader's buffer and envKeep, whatever the environment's size.
func scanEnviron(r io.Reader) (*environ, error) {
	env := &environ{}
	br := bufio.NewReaderSize(r, 4096)
	var cur []byte
	for {
		chunk, err := br.ReadSlice(0)
		ended := err == nil
		if ended {
			chunk = chunk[:len(chunk)-1]
		}
		if room := envKeep - len(cur); room > 0 {
			cur = append(cur, chunk[:min(room, len(chunk))]...)
		}
		if ended || (err == io.EOF && len(cur) > 0) {
			env.set(cur)
			cur = cur[:0]
		}
		switch {
		case err == io.EOF:
			return env, nil
		case err != nil && !errors.Is(err, bufio.ErrBufferFull):
			return nil, err
		}
	}
}

// set keeps kv if it is one of the two variables.
func (env *environ) set(kv []byte) {
	k, v, ok := bytes.Cut(kv, []byte{'='})
	if !ok {
		return
	}
	if len(v) > maxVisibleLen {
		v = v[:maxVisibleLen+1] // still too long to believe, but not kept whole
	}
	switch string(k) {
	case "CUDA_VISIBLE_DEVICES":
		s := string(v)
		env.cuda = &s
	case "NVIDIA_VISIBLE_DEVICES":
		s := string(v)
		env.nvidia = &s
	}
}
