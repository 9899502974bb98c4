//go:build linux

package discover

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const fixtureRoot = "testdata/proc"

const (
	fixCudart = "/usr/local/cuda-12.4/targets/x86_64-linux/lib/libcudart.so.12.4.127"
	fixCuda   = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
	fixNCCL   = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
)

// fixtureProcesses is what a scan of testdata/proc must find.
var fixtureProcesses = []Process{
	{PID: 100, Comm: "python3", StartTime: 123456, Libs: []Mapping{
		{PID: 100, Lib: LibCudart, Path: fixCudart, Dev: unix.Mkdev(0x103, 2), Inode: 1839412},
		{PID: 100, Lib: LibCuda, Path: fixCuda, Dev: unix.Mkdev(0x103, 2), Inode: 2228231},
		{PID: 100, Lib: LibNCCL, Path: fixNCCL, Dev: unix.Mkdev(0x103, 2), Inode: 2229001},
	}},
	{PID: 200, Comm: "train (rank 0)", StartTime: 200200, Libs: []Mapping{
		{PID: 200, Lib: LibCudart, Path: "/opt/cuda/lib64/libcudart.so.12", Dev: unix.Mkdev(8, 1), Inode: 500},
		{PID: 200, Lib: LibNCCL, Path: "/usr/lib64/libnccl.so.2.21.5", Dev: unix.Mkdev(8, 1), Inode: 777},
	}},
	{PID: 400, Comm: "stale", StartTime: 400400, Libs: []Mapping{
		{PID: 400, Lib: LibNCCL, Path: "/usr/lib/libnccl.so.2", Dev: unix.Mkdev(8, 1), Inode: 901},
	}},
	{PID: 500, Comm: "worker ) (x", StartTime: 500500, Libs: []Mapping{
		// Mapped through two paths: one Mapping, under the first path.
		{PID: 500, Lib: LibCudart, Path: "/opt/my libs/libcudart.so.11.0", Dev: unix.Mkdev(0, 0x2f), Inode: 42},
		// Another copy of the same library: a Mapping of its own.
		{PID: 500, Lib: LibCudart, Path: "/usr/lib/python3/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12", Dev: unix.Mkdev(0x103, 2), Inode: 43},
		{PID: 500, Lib: LibCuda, Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", Dev: unix.Mkdev(0x103, 2), Inode: 44},
	}},
}

// problemLines lists the malformed lines of testdata/proc/200/maps, by
// line number; the garbage line without a library path and the empty line
// are not parsed at all.
var problemLines = []string{"line 2:", "line 3:", "line 4:", "line 5:", "line 6:", "line 7:", "line 8:", "line 9:"}

func TestScanFixture(t *testing.T) {
	res, err := (&Scanner{ProcRoot: fixtureRoot}).Scan()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(withoutText(res.Processes), fixtureProcesses) {
		t.Errorf("processes:\n got %+v\nwant %+v", res.Processes, fixtureProcesses)
	}
	// 100, 200, 300, 400, 500, 600; not self, sys, thread-self or 0123.
	if res.Scanned != 6 {
		t.Errorf("Scanned = %d, want 6", res.Scanned)
	}

	var got200, got400 []Problem
	for _, p := range res.Problems {
		switch p.PID {
		case 200:
			got200 = append(got200, p)
		case 400:
			got400 = append(got400, p)
		default:
			t.Errorf("unexpected problem %v", p)
		}
	}
	t.Run("malformed lines", func(t *testing.T) {
		if len(got200) != len(problemLines) {
			t.Fatalf("pid 200 problems: %v; want one for each of %v", got200, problemLines)
		}
		for i, p := range got200 {
			if !errors.Is(p.Err, ErrMalformedMapsLine) || !strings.Contains(p.Err.Error(), problemLines[i]) ||
				!strings.Contains(p.Err.Error(), "read maps of pid 200") {
				t.Errorf("problem %d = %v; want a malformed %s", i, p.Err, problemLines[i])
			}
		}
	})
	t.Run("deleted library", func(t *testing.T) {
		// Two lines of the same deleted file: one problem. The deleted memfd is
		// not a library and is not reported.
		if len(got400) != 1 || !errors.Is(got400[0].Err, ErrDeletedLibrary) ||
			!strings.Contains(got400[0].Err.Error(), "/usr/local/cuda/lib64/libcudart.so.12") {
			t.Errorf("pid 400 problems = %v; want one deleted libcudart", got400)
		}
	})
}

func TestScanPIDFilter(t *testing.T) {
	tests := []struct {
		name      string
		pid       int
		want      []Process
		scanned   int
		problems  int
		wantError bool
	}{
		{name: "library process", pid: 100, want: fixtureProcesses[:1], scanned: 1},
		{name: "malformed lines", pid: 200, want: fixtureProcesses[1:2], scanned: 1, problems: len(problemLines)},
		{name: "no libraries", pid: 300, scanned: 1},
		{name: "zombie", pid: 600, scanned: 1},
		{name: "missing pid", pid: 999},
		{name: "negative pid", pid: -1, wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := (&Scanner{ProcRoot: fixtureRoot, PID: tt.pid}).Scan()
			if tt.wantError {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(withoutText(res.Processes), tt.want) {
				t.Errorf("processes:\n got %+v\nwant %+v", res.Processes, tt.want)
			}
			if res.Scanned != tt.scanned || len(res.Problems) != tt.problems {
				t.Errorf("Scanned = %d, problems = %v; want %d, %d problems", res.Scanned, res.Problems, tt.scanned, tt.problems)
			}
		})
	}
}

func TestScanMissingRoot(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	for _, pid := range []int{0, 1} {
		if _, err := (&Scanner{ProcRoot: missing, PID: pid}).Scan(); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Scan of a missing root with PID %d: err = %v, want ErrNotExist", pid, err)
		}
	}
}

// writeProc writes a one-process procfs tree and returns its root.
func writeProc(t *testing.T, pid string, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, pid)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestScanOverlongLine(t *testing.T) {
	good := "7f00-7f10 r-xp 00000000 08:01 5 /usr/lib/libcuda.so.1\n"
	long := "7f10-7f20 r-xp 00000000 08:01 6 /" + strings.Repeat("x", 3*mapsBufferSize) + "/libcudart.so.12\n"
	noNewline := "7f20-7f30 r-xp 00000000 08:01 7 /usr/lib/libnccl.so.2"
	root := writeProc(t, "7", map[string]string{
		"maps": good + long + good + noNewline,
		"comm": "x\n",
		"stat": "7 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 99\n",
	})
	res, err := (&Scanner{ProcRoot: root}).Scan()
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{{PID: 7, Comm: "x", StartTime: 99, Libs: []Mapping{
		{PID: 7, Lib: LibCuda, Path: "/usr/lib/libcuda.so.1", Dev: unix.Mkdev(8, 1), Inode: 5},
		{PID: 7, Lib: LibNCCL, Path: "/usr/lib/libnccl.so.2", Dev: unix.Mkdev(8, 1), Inode: 7},
	}}}
	if !reflect.DeepEqual(withoutText(res.Processes), want) {
		t.Errorf("processes:\n got %+v\nwant %+v", res.Processes, want)
	}
	if len(res.Problems) != 1 || !errors.Is(res.Problems[0].Err, ErrMalformedMapsLine) ||
		!strings.Contains(res.Problems[0].Err.Error(), "line 2: malformed maps line: line too long") {
		t.Errorf("problems = %v; want line 2 too long", res.Problems)
	}
}

func TestScanUnreadable(t *testing.T) {
	t.Run("maps", func(t *testing.T) {
		root := writeProc(t, "8", nil)
		if err := os.Mkdir(filepath.Join(root, "8", "maps"), 0o755); err != nil {
			t.Fatal(err)
		}
		res, err := (&Scanner{ProcRoot: root}).Scan()
		if err != nil {
			t.Fatal(err)
		}
		if res.Scanned != 1 || len(res.Processes) != 0 || len(res.Problems) != 1 ||
			!errors.Is(res.Problems[0].Err, unix.EISDIR) || !strings.Contains(res.Problems[0].Err.Error(), "read maps of pid 8") {
			t.Errorf("result = %+v; want one EISDIR problem", res)
		}
	})
	t.Run("stat and comm", func(t *testing.T) {
		root := writeProc(t, "9", map[string]string{
			"maps": "7f00-7f10 r-xp 00000000 08:01 5 /usr/lib/libcuda.so.1\n",
			"stat": "garbage\n",
		})
		if err := os.Mkdir(filepath.Join(root, "9", "comm"), 0o755); err != nil {
			t.Fatal(err)
		}
		res, err := (&Scanner{ProcRoot: root}).Scan()
		if err != nil {
			t.Fatal(err)
		}
		// The process still counts, without comm and start time.
		if len(res.Processes) != 1 || res.Processes[0].Comm != "" || res.Processes[0].StartTime != 0 || len(res.Problems) != 2 {
			t.Errorf("result = %+v; want the process and two problems", res)
		}
	})
	t.Run("vanished process", func(t *testing.T) {
		// A PID directory without maps looks like a process that exited
		// between listing and reading: skipped silently.
		root := writeProc(t, "10", nil)
		res, err := (&Scanner{ProcRoot: root}).Scan()
		if err != nil {
			t.Fatal(err)
		}
		if res.Scanned != 0 || len(res.Processes) != 0 || len(res.Problems) != 0 {
			t.Errorf("result = %+v; want nothing", res)
		}
	})
}

// TestScanLiveProc scans this test process in the real /proc: it maps no
// CUDA library (at most the dynamic loader).
func TestScanLiveProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/maps"); err != nil {
		t.Skip("no procfs:", err)
	}
	res, err := (&Scanner{PID: os.Getpid()}).Scan()
	if err != nil {
		t.Fatal(err)
	}
	if res.Scanned != 1 || len(res.Problems) != 0 || len(res.Processes) > 1 {
		t.Errorf("result = %+v; want one scanned process and nothing else", res)
	}
	for _, p := range res.Processes {
		for _, m := range p.Libs {
			if m.Lib != LibLoader {
				t.Errorf("test process maps %+v", m)
			}
		}
	}
	all, err := (&Scanner{ProcRoot: "/proc"}).Scan()
	if err != nil {
		t.Fatal(err)
	}
	if all.Scanned < 1 {
		t.Errorf("scan of /proc looked at %d processes", all.Scanned)
	}
	start, err := ReadStartTime("", os.Getpid())
	if err != nil || start == 0 {
		t.Fatalf("ReadStartTime(self) = %d, %v", start, err)
	}
	if !Alive("", os.Getpid(), start) || Alive("", os.Getpid(), start+1) {
		t.Error("Alive does not recognise this process by its start time")
	}
	comm, err := ReadComm("", os.Getpid())
	if err != nil || comm == "" || strings.ContainsRune(comm, '\n') {
		t.Errorf("ReadComm(self) = %q, %v", comm, err)
	}
}

func TestListPIDs(t *testing.T) {
	pids, err := ListPIDs(fixtureRoot)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{100, 200, 300, 400, 500, 600}; !reflect.DeepEqual(pids, want) {
		t.Errorf("ListPIDs = %v, want %v", pids, want)
	}
}

func TestParsePID(t *testing.T) {
	for _, tt := range []struct {
		s  string
		ok bool
	}{
		{"1", true}, {"4194304", true}, {"2147483647", true},
		{"", false}, {"0", false}, {"0123", false}, {"+5", false}, {"-5", false}, {"self", false},
		{"12a", false}, {"2147483648", false}, {"99999999999", false},
	} {
		t.Run(tt.s, func(t *testing.T) {
			if _, ok := parsePID(tt.s); ok != tt.ok {
				t.Errorf("parsePID(%q) ok = %v, want %v", tt.s, ok, tt.ok)
			}
		})
	}
}

func TestAlive(t *testing.T) {
	tests := []struct {
		name  string
		pid   int
		start uint64
		want  bool
	}{
		{"any start time", 100, 0, true},
		{"matching start time", 100, 123456, true},
		{"reused pid", 100, 123457, false},
		{"missing pid", 999, 0, false},
		{"zombie", 600, 0, false},
		{"invalid pid", 0, 0, false},
		{"negative pid", -1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Alive(fixtureRoot, tt.pid, tt.start); got != tt.want {
				t.Errorf("Alive(%d, %d) = %v, want %v", tt.pid, tt.start, got, tt.want)
			}
		})
	}
}

func TestReadCommAndStartTime(t *testing.T) {
	comm, err := ReadComm(fixtureRoot, 500)
	if err != nil || comm != "worker ) (x" {
		t.Errorf("ReadComm(500) = %q, %v", comm, err)
	}
	start, err := ReadStartTime(fixtureRoot, 500)
	if err != nil || start != 500500 {
		t.Errorf("ReadStartTime(500) = %d, %v", start, err)
	}
	if _, err := ReadComm(fixtureRoot, 999); !errors.Is(err, ErrProcessGone) {
		t.Errorf("ReadComm(missing) err = %v, want ErrProcessGone", err)
	}
	if _, err := ReadStartTime(fixtureRoot, 600); err != nil {
		t.Errorf("ReadStartTime(zombie) err = %v", err)
	}
}

func TestMkdevMatchesUnix(t *testing.T) {
	for _, d := range [][2]uint32{{0, 0}, {8, 1}, {0x103, 2}, {0xfff, 0xfffff}, {0xffffffff, 0xffffffff}, {0x12345, 0x6789a}} {
		if got, want := mkdev(d[0], d[1]), unix.Mkdev(d[0], d[1]); got != want {
			t.Errorf("mkdev(%#x, %#x) = %#x, want %#x", d[0], d[1], got, want)
		}
		if maj, min := devParts(unix.Mkdev(d[0], d[1])); maj != d[0] || min != d[1] {
			t.Errorf("devParts(Mkdev(%#x, %#x)) = %#x, %#x", d[0], d[1], maj, min)
		}
	}
}

func BenchmarkScanFixture(b *testing.B) {
	s := &Scanner{ProcRoot: fixtureRoot}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Scan(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScanProc(b *testing.B) {
	s := &Scanner{ProcRoot: "/proc"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Scan(); err != nil {
			b.Fatal(err)
		}
	}
}

// withoutText clears the text ranges, which TestScanTextRange checks on
// their own, so the other tests can state mappings compactly.
func withoutText(ps []Process) []Process {
	if ps == nil {
		return nil
	}
	out := make([]Process, len(ps))
	for i, p := range ps {
		p.Libs = append([]Mapping(nil), p.Libs...)
		for j := range p.Libs {
			p.Libs[j].TextStart, p.Libs[j].TextEnd = 0, 0
		}
		out[i] = p
	}
	return out
}

// The text range of a library is its first executable mapping.
func TestScanTextRange(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "9")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	maps := "7f0000000000-7f0000001000 r--p 00000000 08:01 42 /lib/libcudart.so.12\n" +
		"7f0000001000-7f0000005000 r-xp 00001000 08:01 42 /lib/libcudart.so.12\n" +
		"7f0000005000-7f0000006000 r--p 00005000 08:01 42 /lib/libcudart.so.12\n" +
		"7f0000010000-7f0000011000 r--p 00000000 08:01 43 /lib/libcuda.so.1\n"
	for name, body := range map[string]string{"maps": maps, "comm": "x\n", "stat": "9 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := (&Scanner{ProcRoot: root, PID: 9}).Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Processes) != 1 || len(res.Processes[0].Libs) != 2 {
		t.Fatalf("got %+v", res.Processes)
	}
	cudart, cuda := res.Processes[0].Libs[0], res.Processes[0].Libs[1]
	if cudart.TextStart != 0x7f0000001000 || cudart.TextEnd != 0x7f0000005000 {
		t.Errorf("libcudart text = %#x-%#x, want 0x7f0000001000-0x7f0000005000", cudart.TextStart, cudart.TextEnd)
	}
	if cuda.TextStart != 0 || cuda.TextEnd != 0 {
		t.Errorf("libcuda without executable mapping has text %#x-%#x", cuda.TextStart, cuda.TextEnd)
	}
}

// TestScanTracers: with Tracers, each reported process's TracerPid is read
// (0 without a tracer); without, status is not read at all; a status
// without the field is a problem and the process still counts.
func TestScanTracers(t *testing.T) {
	files := func(status string) map[string]string {
		m := map[string]string{
			"maps": "7f00-7f10 r-xp 00000000 08:01 5 /usr/lib/libcuda.so.1\n",
			"comm": "x\n",
			"stat": "7 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 99\n",
		}
		if status != "" {
			m["status"] = status
		}
		return m
	}
	for _, tc := range []struct {
		name, status string
		tracers      bool
		want         int
		problems     int
	}{
		{"traced", "Name:\tx\nState:\tS (sleeping)\nTracerPid:\t4242\nUid:\t0\n", true, 4242, 0},
		{"not traced", "Name:\tx\nTracerPid:\t0\n", true, 0, 0},
		{"not asked", "Name:\tx\nTracerPid:\t4242\n", false, 0, 0},
		{"not asked, no status file", "", false, 0, 0},
		{"no field", "Name:\tx\n", true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := writeProc(t, "7", files(tc.status))
			res, err := (&Scanner{ProcRoot: root, Tracers: tc.tracers}).Scan()
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Processes) != 1 || res.Processes[0].TracerPID != tc.want || len(res.Problems) != tc.problems {
				t.Errorf("result %+v; want one process with TracerPID %d and %d problems", res, tc.want, tc.problems)
			}
		})
	}
}
