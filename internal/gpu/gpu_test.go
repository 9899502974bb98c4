package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/nvml"
)

// UUIDs of the fake node's four GPUs; GPU 1 is in MIG mode with two devices.
const (
	uuidA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	uuidB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
	uuidC = "GPU-cccccccc-0000-0000-0000-000000000000"
	uuidD = "GPU-dddddddd-0000-0000-0000-000000000000"
	mig1a = "MIG-1a1a1a1a-0000-0000-0000-000000000000"
	mig1b = "MIG-1b1b1b1b-0000-0000-0000-000000000000"
)

// node is a fake NVML inventory: index i has UUID uuids[i]; minor numbers
// are permuted against the indices (minor = 3 - index), as on machines
// where /dev/nvidiaN does not follow the PCI order.
func node() []nvml.GPU {
	uuids := []string{uuidA, uuidB, uuidC, uuidD}
	var gpus []nvml.GPU
	for i, u := range uuids {
		gpus = append(gpus, nvml.GPU{Index: i, UUID: u, Minor: new(3 - i)})
	}
	gpus[1].MIGDevices = []nvml.MigDevice{{UUID: mig1a, GPUInstanceID: 1}, {UUID: mig1b, GPUInstanceID: 2}}
	return gpus
}

func s(v string) *string { return &v }

func dev(i int, uuid string) Device { return Device{Index: i, UUID: uuid} }

func TestVisibleWithNVML(t *testing.T) {
	all := []Device{dev(0, uuidA), dev(1, uuidB), dev(2, uuidC), dev(3, uuidD)}
	for _, tc := range []struct {
		name         string
		cuda, nvidia *string
		want         []Device
	}{
		{"unset: every GPU in NVML order", nil, nil, all},
		{"permutation", s("2,0,1"), nil, []Device{dev(2, uuidC), dev(0, uuidA), dev(1, uuidB)}},
		{"spaces", s(" 1, 3"), nil, []Device{dev(1, uuidB), dev(3, uuidD)}},
		{"empty hides every GPU", s(""), nil, []Device{}},
		{"out of range truncates", s("0,7,1"), nil, []Device{dev(0, uuidA)}},
		{"garbage truncates", s("0,x,1"), nil, []Device{dev(0, uuidA)}},
		{"negative truncates", s("-1,0"), nil, []Device{}},
		{"sign truncates", s("+1"), nil, []Device{}},
		{"repeat truncates", s("1,1,2"), nil, []Device{dev(1, uuidB)}},
		{"trailing comma truncates", s("3,"), nil, []Device{dev(3, uuidD)}},
		{"uuid and index", s(uuidC + ",0"), nil, []Device{dev(2, uuidC), dev(0, uuidA)}},
		{"uuid prefix", s("GPU-dddd"), nil, []Device{dev(3, uuidD)}},
		{"ambiguous prefix truncates", s("GPU-"), nil, []Device{}},
		{"unknown uuid truncates", s("1,GPU-ffffffff"), nil, []Device{dev(1, uuidB)}},
		{"MIG", s(mig1b), nil, []Device{dev(1, mig1b)}},
		{"unknown MIG truncates", s("MIG-ffff"), nil, []Device{}},
		{"all is no CUDA value", s("all"), nil, []Device{}},
		{"container all", nil, s("all"), all},
		{"container none", nil, s("none"), []Device{}},
		{"container void", nil, s("void"), []Device{}},
		{"container empty", nil, s(""), []Device{}},
		{"container devices in node order", nil, s("3,1"), []Device{dev(1, uuidB), dev(3, uuidD)}},
		{"container uuids", nil, s(uuidD + "," + uuidA), []Device{dev(0, uuidA), dev(3, uuidD)}},
		{"container skips invalid entries", nil, s("0,zz,2"), []Device{dev(0, uuidA), dev(2, uuidC)}},
		{"container MIG", nil, s(mig1a), []Device{dev(1, mig1a)}},
		{"CUDA ordinals inside the container", s("1"), s("2,3"), []Device{dev(3, uuidD)}},
		{"CUDA permutes inside the container", s("1,0"), s(uuidA + "," + uuidC), []Device{dev(2, uuidC), dev(0, uuidA)}},
		{"CUDA uuid outside the container", s(uuidA), s("2,3"), []Device{}},
		{"CUDA uuid inside the container", s(uuidD), s("2,3"), []Device{dev(3, uuidD)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Visible(tc.cuda, tc.nvidia, node())
			if got == nil {
				got = []Device{}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Visible(%v, %v) = %v, want %v", deref(tc.cuda), deref(tc.nvidia), got, tc.want)
			}
		})
	}
}

func deref(p *string) string {
	if p == nil {
		return "<unset>"
	}
	return strconv.Quote(*p)
}

// Without NVML numbers are NVML indices and UUIDs are taken as given.
func TestVisibleWithoutNVML(t *testing.T) {
	for _, tc := range []struct {
		name         string
		cuda, nvidia *string
		ordinal      int
		want         Device
		ok           bool
	}{
		{"unset: ordinal is the index", nil, nil, 5, dev(5, ""), true},
		{"permutation", s("2,0,1"), nil, 0, dev(2, ""), true},
		{"permutation 2", s("2,0,1"), nil, 2, dev(1, ""), true},
		{"beyond the list", s("2,0,1"), nil, 3, dev(-1, ""), false},
		{"uuid", s(uuidC + ",1"), nil, 0, dev(-1, uuidC), true},
		{"after a uuid", s(uuidC + ",1"), nil, 1, dev(1, ""), true},
		{"MIG", s(mig1a), nil, 0, dev(-1, mig1a), true},
		{"garbage truncates", s("3,x,1"), nil, 1, dev(-1, ""), false},
		{"container set in order", nil, s("3,1"), 0, dev(1, ""), true},
		{"container uuid after indices", nil, s(uuidA + ",2"), 1, dev(-1, uuidA), true},
		{"CUDA inside container", s("1"), s("2,3"), 0, dev(3, ""), true},
		{"container none", nil, s("none"), 0, dev(-1, ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := visible(tc.cuda, tc.nvidia, nil).ordinal(tc.ordinal)
			if got != tc.want || ok != tc.ok {
				t.Errorf("ordinal %d of (%v, %v) = %v, %v; want %v, %v", tc.ordinal, deref(tc.cuda), deref(tc.nvidia), got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseEnviron(t *testing.T) {
	env := parseEnviron([]byte("PATH=/bin\x00CUDA_VISIBLE_DEVICES=\x00NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b\x00X_CUDA_VISIBLE_DEVICES=9\x00noequals\x00"))
	if env.cuda == nil || *env.cuda != "" {
		t.Errorf("cuda = %v, want set and empty", deref(env.cuda))
	}
	if env.nvidia == nil || *env.nvidia != "GPU-a,GPU-b" {
		t.Errorf("nvidia = %v", deref(env.nvidia))
	}
	if env := parseEnviron(nil); env.cuda != nil || env.nvidia != nil {
		t.Errorf("empty environment: %+v", env)
	}
}

// fakeProc writes /proc/PID/environ and /proc/PID/fd/* (symlinks to
// targets) under root.
func fakeProc(t *testing.T, root string, pid int, environ string, fds ...string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(environ), 0o644); err != nil {
		t.Fatal(err)
	}
	writeStat(t, dir, pid, startOf(pid))
	for i, target := range fds {
		if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// startOf is the start time fakeProc gives a process.
func startOf(pid int) uint64 { return uint64(pid) * 100 }

// writeStat writes a stat line with the start time (field 22) start.
func writeStat(t *testing.T, dir string, pid int, start uint64) {
	t.Helper()
	line := fmt.Sprintf("%d (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, start)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceFiles(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 10, "", "/dev/null", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia2", "/dev/nvidia10", "socket:[123]")
	if got, want := DeviceFiles(root, 10), []int{2, 10}; !reflect.DeepEqual(got, want) {
		t.Errorf("DeviceFiles = %v, want %v", got, want)
	}
	if got := DeviceFiles(root, 11); got != nil {
		t.Errorf("DeviceFiles of a missing process = %v, want nil", got)
	}
}

func up(gpus []nvml.GPU) func() *nvml.Snapshot {
	return func() *nvml.Snapshot { return &nvml.Snapshot{Up: true, GPUs: gpus} }
}

type want struct{ gpu, uuid, source string }

func check(t *testing.T, l *Labeler, pid int, d uint32, w want) {
	t.Helper()
	g, u, src := l.GPU(pid, startOf(pid), d)
	if (want{g, u, src}) != w {
		t.Errorf("GPU(%d, %#x) = %q %q %q, want %q %q %q", pid, d, g, u, src, w.gpu, w.uuid, w.source)
	}
}

func TestLabelerWithNVML(t *testing.T) {
	root := t.TempDir()
	gpus := node()
	gpus[3].Processes = []nvml.Process{{PID: 20}}
	gpus[1].Processes = []nvml.Process{{PID: 21, MIGUUIDs: []string{mig1b}}}
	fakeProc(t, root, 10, "CUDA_VISIBLE_DEVICES=2,0,1\x00", "/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidia2")
	fakeProc(t, root, 20, "CUDA_VISIBLE_DEVICES=2,0,1\x00", "/dev/nvidia1")
	fakeProc(t, root, 21, "")
	fakeProc(t, root, 22, "NVIDIA_VISIBLE_DEVICES="+uuidD+"\x00", "/dev/nvidiactl", "/dev/nvidia1")
	fakeProc(t, root, 23, "CUDA_VISIBLE_DEVICES=3,1\x00", "/dev/nvidia0", "/dev/nvidia2")
	l := &Labeler{ProcRoot: root, NVML: up(gpus)}

	// cudaSetDevice ordinals through the permuted list.
	check(t, l, 10, 0, want{"2", uuidC, SourceSetDevice})
	check(t, l, 10, 1, want{"0", uuidA, SourceSetDevice})
	check(t, l, 10, 2, want{"1", uuidB, SourceSetDevice})
	check(t, l, 10, 3, want{"", "", SourceSetDevice}) // beyond the list
	// No cudaSetDevice: three device files, not in NVML: the default, ordinal 0.
	check(t, l, 10, bpfobj.DevNone, want{"2", uuidC, SourceDefault})
	// NVML lists the process on one GPU: that one, before the device file.
	check(t, l, 20, bpfobj.DevNone, want{"3", uuidD, SourceNVMLProcess})
	check(t, l, 21, bpfobj.DevNone, want{"1", mig1b, SourceNVMLProcess})
	// One device file: minor 1 is NVML index 2 on this node.
	check(t, l, 22, bpfobj.DevNone, want{"2", uuidC, SourceDeviceFile})
	// Two device files: the default.
	check(t, l, 23, bpfobj.DevNone, want{"3", uuidD, SourceDefault})
	// A missing process: empty labels.
	check(t, l, 99, 0, want{"", "", SourceSetDevice})

	// Answers are final once NVML answered: a later environment is not read.
	fakeProc(t, root, 24, "CUDA_VISIBLE_DEVICES=1\x00")
	check(t, l, 24, 0, want{"1", uuidB, SourceSetDevice})
	if err := os.WriteFile(filepath.Join(root, "24", "environ"), []byte("CUDA_VISIBLE_DEVICES=3\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	check(t, l, 24, 0, want{"1", uuidB, SourceSetDevice})
	l.Forget(24)
	check(t, l, 24, 0, want{"3", uuidD, SourceSetDevice})
}

// A new process reusing a PID (same PID, another start time) never gets
// the old one's answers, even without Forget; asked for the old start
// time, the labeler refuses the new process's files.
func TestLabelerPIDReuse(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 30, "CUDA_VISIBLE_DEVICES=1\x00")
	l := &Labeler{ProcRoot: root, NVML: up(node())}
	if g, u, _ := l.GPU(30, startOf(30), 0); g != "1" || u != uuidB {
		t.Fatalf("first process: %q %q, want 1 %s", g, u, uuidB)
	}
	dir := filepath.Join(root, "30")
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte("CUDA_VISIBLE_DEVICES=3\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeStat(t, dir, 30, 7777)
	if g, u, _ := l.GPU(30, 7777, 0); g != "3" || u != uuidD {
		t.Errorf("new process on the reused PID: %q %q, want 3 %s", g, u, uuidD)
	}
	// The old process's answer was replaced, and its start time no longer
	// reads the PID's files.
	if g, u, _ := l.GPU(30, startOf(30), 1); g != "" || u != "" {
		t.Errorf("old start time on the reused PID: %q %q, want no labels", g, u)
	}
}

// Without NVML, UUIDs from a process's environment are labels only in
// NVIDIA's format; a 1 MiB value (the attack of issue 17) gives no label
// and counts one rejected value.
func TestLabelerRejectsHostileUUIDs(t *testing.T) {
	root := t.TempDir()
	huge := "GPU-" + strings.Repeat("a", 1<<20)
	fakeProc(t, root, 40, "CUDA_VISIBLE_DEVICES="+huge+"\x00")
	fakeProc(t, root, 41, "CUDA_VISIBLE_DEVICES=GPU-zzzz,"+uuidC+"\x00")
	fakeProc(t, root, 42, "CUDA_VISIBLE_DEVICES=GPU-cccc,"+uuidA+"\x00")
	fakeProc(t, root, 43, "NVIDIA_VISIBLE_DEVICES="+strings.Repeat("0,", 1<<20)+"\x00")
	l := &Labeler{ProcRoot: root}
	check(t, l, 40, 0, want{"", "", SourceSetDevice})
	check(t, l, 40, bpfobj.DevNone, want{"", "", SourceDefault})
	// Not hex: cannot name a device; as in CUDA the list ends there.
	check(t, l, 41, 0, want{"", "", SourceSetDevice})
	check(t, l, 41, 1, want{"", "", SourceSetDevice})
	// A well-formed prefix is a device of unknown UUID, the next one labelled.
	check(t, l, 42, 0, want{"", "", SourceSetDevice})
	check(t, l, 42, 1, want{"", uuidA, SourceSetDevice})
	check(t, l, 43, 0, want{"", "", SourceSetDevice})
	if got := l.Rejected(); got != 3 {
		t.Errorf("Rejected() = %d, want 3 (pid 40's value, pid 41's GPU-zzzz, pid 43's value)", got)
	}
}

func TestUUIDForm(t *testing.T) {
	const u = "8932f937-d72c-4106-c12f-20bd9faed9f6"
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"GPU-" + u, uuidFull},
		{"GPU-" + strings.ToUpper(u), uuidFull},
		{"MIG-" + u, uuidFull},
		{"MIG-GPU-" + u + "/1/0", uuidFull},
		{"MIG-GPU-" + u + "/14/7", uuidFull},
		{"GPU-", uuidPrefix},
		{"GPU-8932f9", uuidPrefix},
		{"GPU-8932f937-d7", uuidPrefix},
		{"MIG-", uuidPrefix},
		{"MIG-GP", uuidPrefix},
		{"MIG-GPU-" + u, uuidPrefix},
		{"MIG-GPU-" + u + "/", uuidPrefix},
		{"MIG-GPU-" + u + "/1", uuidPrefix},
		{"MIG-GPU-" + u + "/1/", uuidPrefix},
		{"GPU-" + u + "0", uuidInvalid},
		{"GPU-" + u + "/1/0", uuidInvalid},
		{"GPU-8932f937d72c", uuidInvalid},
		{"GPU-xyz", uuidInvalid},
		{"GPU-8932\u00e9", uuidInvalid},
		{"MIG-GPU-" + u + "/1/0/2", uuidInvalid},
		{"MIG-GPU-" + u + "/1234/0", uuidInvalid},
		{"MIG-GPU-" + u + "/a/0", uuidInvalid},
		{"MIG-GPX", uuidInvalid},
		{"0", uuidInvalid},
	} {
		if got := uuidForm(tc.in); got != tc.want {
			t.Errorf("uuidForm(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestLabelerWithoutNVML(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 10, "CUDA_VISIBLE_DEVICES="+uuidC+",3\x00")
	fakeProc(t, root, 11, "", "/dev/nvidia5", "/dev/nvidiactl")
	fakeProc(t, root, 12, "NVIDIA_VISIBLE_DEVICES=2,1\x00", "/dev/nvidia1", "/dev/nvidia2")
	l := &Labeler{ProcRoot: root} // NVML disabled
	check(t, l, 10, 0, want{"", uuidC, SourceSetDevice})
	check(t, l, 10, 1, want{"3", "", SourceSetDevice})
	check(t, l, 10, bpfobj.DevNone, want{"", uuidC, SourceDefault})
	check(t, l, 11, bpfobj.DevNone, want{"5", "", SourceDeviceFile})
	check(t, l, 11, 4, want{"4", "", SourceSetDevice})
	check(t, l, 12, bpfobj.DevNone, want{"1", "", SourceDefault})
}

// While NVML is configured but not up, answers are not kept: they improve
// once it is.
func TestLabelerNVMLLate(t *testing.T) {
	root := t.TempDir()
	fakeProc(t, root, 10, "CUDA_VISIBLE_DEVICES=2,0\x00")
	snap := &nvml.Snapshot{Reason: "not polled yet"}
	l := &Labeler{ProcRoot: root, NVML: func() *nvml.Snapshot { return snap }}
	check(t, l, 10, 0, want{"2", "", SourceSetDevice})
	snap = &nvml.Snapshot{Up: true, GPUs: node()}
	check(t, l, 10, 0, want{"2", uuidC, SourceSetDevice})
	check(t, l, 10, 1, want{"0", uuidA, SourceSetDevice})
	snap = &nvml.Snapshot{Reason: "down"}
	check(t, l, 10, 0, want{"2", uuidC, SourceSetDevice}) // kept
}

// A 4 MiB environment of 2 million one-byte variables (issue 30 item 7)
// cost about 48 MiB to split in one piece; streamed, reading it allocates
// a bounded amount whatever its size, and the variables after the
// padding are still found.
func TestLabelerHugeEnviron(t *testing.T) {
	root := t.TempDir()
	env := strings.Repeat("a\x00", 2<<20-64) + "CUDA_VISIBLE_DEVICES=1\x00"
	fakeProc(t, root, 50, env)
	l := &Labeler{ProcRoot: root, NVML: up(node())}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	check(t, l, 50, 0, want{"1", uuidB, SourceSetDevice})
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("environment of %d bytes: %d KiB allocated", len(env), alloc>>10)
	if alloc > 256<<10 {
		t.Errorf("reading a %d-byte environment allocated %d KiB, want at most 256 KiB", len(env), alloc>>10)
	}
}

// A process chooses its own environment: with NVML up, a device it names
// there (here another GPU's UUID, with NVIDIA_VISIBLE_DEVICES=all) is
// believed only if the process holds that GPU's /dev/nvidiaN open (CUDA
// opens those of every visible GPU at initialisation; issue 30 item 7); a
// claim of a GPU it does not hold gives no label and counts a rejected
// value. A process holding no GPU device file cannot be checked: its
// environment is used. NVML's process list is no evidence here: it is as
// old as the last poll, and an answer is kept.
func TestLabelerRefusesClaimedGPU(t *testing.T) {
	root := t.TempDir()
	gpus := node()
	// Holds GPU 0 (minor 3) and claims GPU 3's UUID.
	fakeProc(t, root, 60, "NVIDIA_VISIBLE_DEVICES=all\x00CUDA_VISIBLE_DEVICES="+uuidD+",0\x00", "/dev/nvidiactl", "/dev/nvidia3")
	// Holds GPU 3 (minor 0): the same list is true for it.
	fakeProc(t, root, 61, "NVIDIA_VISIBLE_DEVICES=all\x00CUDA_VISIBLE_DEVICES="+uuidD+",0\x00", "/dev/nvidia0", "/dev/nvidia3")
	// Holds GPU 2 (minor 1), names GPU 2 and GPU 1.
	fakeProc(t, root, 62, "CUDA_VISIBLE_DEVICES=2,1\x00", "/dev/nvidia1")
	// Holds no GPU device file: unchecked.
	fakeProc(t, root, 63, "CUDA_VISIBLE_DEVICES=3\x00", "/dev/nvidiactl")
	l := &Labeler{ProcRoot: root, NVML: up(gpus)}
	check(t, l, 60, 0, want{"", "", SourceSetDevice})
	check(t, l, 60, 1, want{"0", uuidA, SourceSetDevice})
	check(t, l, 61, 0, want{"3", uuidD, SourceSetDevice})
	check(t, l, 61, 1, want{"0", uuidA, SourceSetDevice})
	check(t, l, 62, 0, want{"2", uuidC, SourceSetDevice})
	check(t, l, 62, 1, want{"", "", SourceSetDevice})
	check(t, l, 63, 0, want{"3", uuidD, SourceSetDevice})
	if got := l.Rejected(); got != 2 {
		t.Errorf("Rejected() = %d, want 2 (pid 60's GPU 3, pid 62's GPU 1)", got)
	}
}
