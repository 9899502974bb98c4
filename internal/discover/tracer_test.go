package discover

import (
	"os"
	"testing"
)

func TestParseTracerPID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int
		err  bool
	}{
		{"Name:\tworkload\nState:\tS (sleeping)\nTgid:\t10\nPid:\t10\nPPid:\t1\nTracerPid:\t0\nUid:\t0\t0\t0\t0\n", 0, false},
		{"Name:\tworkload\nTracerPid:\t4242\nUid:\t0\n", 4242, false},
		{"TracerPid:\t7", 7, false},
		{"Name:\tx\nTracerPid:\t-1\n", 0, true},
		{"Name:\tx\nTracerPid:\tabc\n", 0, true},
		{"Name:\tTracerPid:\t5\n", 0, true}, // a comm that says TracerPid: is not the field
		{"", 0, true},
	} {
		got, err := ParseTracerPID([]byte(tc.in))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseTracerPID(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	// This test's own status: not traced (go test runs without a debugger).
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	if pid, err := ParseTracerPID(b); err != nil || pid != 0 {
		t.Errorf("own TracerPid %d, %v", pid, err)
	}
}

func FuzzParseTracerPID(f *testing.F) {
	f.Add([]byte("Name:\tw\nTracerPid:\t12\n"))
	f.Add([]byte("TracerPid:\t0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if pid, err := ParseTracerPID(b); err == nil && pid < 0 {
			t.Fatalf("negative pid %d", pid)
		}
	})
}
