package attach

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/discover"
)

func mapping(pid int, lib discover.Library, path string, dev, inode uint64) discover.Mapping {
	return discover.Mapping{PID: pid, Lib: lib, Path: path, Dev: dev, Inode: inode}
}

func TestTargets(t *testing.T) {
	t.Parallel()
	dev := unix.Mkdev(8, 1)
	overlay := unix.Mkdev(0, 0x2f)
	type want struct {
		key  FileKey
		lib  discover.Library
		path string
		pids []int
	}
	tests := []struct {
		name  string
		procs []discover.Process
		want  []want
	}{
		{
			name: "two processes map one file",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/usr/lib/libcudart.so.12", dev, 500)}},
				{PID: 20, Libs: []discover.Mapping{mapping(20, discover.LibCudart, "/opt/cuda/libcudart.so.12", dev, 500)}},
			},
			want: []want{{FileKey{dev, 500}, discover.LibCudart, "/usr/lib/libcudart.so.12", []int{10, 20}}},
		},
		{
			name: "different inodes",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/a/libcudart.so.12", dev, 501)}},
				{PID: 20, Libs: []discover.Mapping{mapping(20, discover.LibCudart, "/b/libcudart.so.12", dev, 500)}},
			},
			want: []want{
				{FileKey{dev, 500}, discover.LibCudart, "/b/libcudart.so.12", []int{20}},
				{FileKey{dev, 501}, discover.LibCudart, "/a/libcudart.so.12", []int{10}},
			},
		},
		{
			name: "same inode on another device",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{mapping(10, discover.LibCudart, "/a/libcudart.so.12", dev, 500)}},
				{PID: 20, Libs: []discover.Mapping{mapping(20, discover.LibCudart, "/a/libcudart.so.12", overlay, 500)}},
			},
			want: []want{
				{FileKey{overlay, 500}, discover.LibCudart, "/a/libcudart.so.12", []int{20}},
				{FileKey{dev, 500}, discover.LibCudart, "/a/libcudart.so.12", []int{10}},
			},
		},
		{
			name: "several libraries of several processes",
			procs: []discover.Process{
				{PID: 10, Libs: []discover.Mapping{
					mapping(10, discover.LibCudart, "/l/libcudart.so.12", dev, 3),
					mapping(10, discover.LibCuda, "/l/libcuda.so.1", dev, 1),
					mapping(10, discover.LibNCCL, "/l/libnccl.so.2", dev, 2),
				}},
				{PID: 30, Libs: []discover.Mapping{mapping(30, discover.LibCuda, "/l/libcuda.so.1", dev, 1)}},
				{PID: 40, Libs: []discover.Mapping{mapping(40, discover.LibCudart, "/l/libcudart.so.12", dev, 3)}},
			},
			want: []want{
				{FileKey{dev, 1}, discover.LibCuda, "/l/libcuda.so.1", []int{10, 30}},
				{FileKey{dev, 2}, discover.LibNCCL, "/l/libnccl.so.2", []int{10}},
				{FileKey{dev, 3}, discover.LibCudart, "/l/libcudart.so.12", []int{10, 40}},
			},
		},
		{name: "no processes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Targets(&discover.Result{Processes: tc.procs}, t.TempDir())
			var view []want
			for _, tg := range got {
				if tg.Open == nil {
					t.Errorf("target %v has no Open", tg.Key)
				}
				view = append(view, want{tg.Key, tg.Lib, tg.Path, tg.PIDs})
			}
			if !reflect.DeepEqual(view, tc.want) {
				t.Errorf("Targets =\n%+v\nwant\n%+v", view, tc.want)
			}
		})
	}
}

// TestTargetOpen: a target opens its file inside a mapping process's root
// and falls through to the next process when one has exited.
func TestTargetOpen(t *testing.T) {
	t.Parallel()
	procRoot := t.TempDir()
	const libPath = "/usr/lib/libcudart.so.12"
	put := func(pid, content string) {
		p := filepath.Join(procRoot, pid, "root", libPath)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("20", "library of 20")
	put("30", "library of 30")
	targets := func(pids ...int) []Target {
		var procs []discover.Process
		for _, pid := range pids {
			procs = append(procs, discover.Process{PID: pid, Libs: []discover.Mapping{mapping(pid, discover.LibCudart, libPath, 1, 1)}})
		}
		return Targets(&discover.Result{Processes: procs}, procRoot)
	}
	tests := []struct {
		name string
		pids []int
		want string // file content; "" = ErrProcessGone
	}{
		{"first process", []int{20, 30}, "library of 20"},
		{"first process gone", []int{10, 30}, "library of 30"},
		{"all gone", []int{10, 11}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := targets(tc.pids...)
			if len(ts) != 1 {
				t.Fatalf("%d targets, want 1", len(ts))
			}
			f, err := ts[0].Open()
			if tc.want == "" {
				if !errors.Is(err, discover.ErrProcessGone) {
					t.Fatalf("Open = %v, %v; want ErrProcessGone", f, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b, err := io.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("opened %q, want %q", b, tc.want)
			}
		})
	}
}
