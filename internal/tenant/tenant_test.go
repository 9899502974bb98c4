package tenant

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type fakeRoots map[uint64]bool

func (r fakeRoots) Put(id uint64) error    { r[id] = true; return nil }
func (r fakeRoots) Delete(id uint64) error { delete(r, id); return nil }

func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// The pod cgroups of kubelet's layouts (both drivers, every QoS class,
// kind's nested kubelet) are found, whatever their containers nest below
// them; directories without "kube" in their name are not read, nor are
// pods' own; a pod whose cgroup goes is forgotten. The ids are the
// directories' inode numbers, read here with os.Stat.
func TestScan(t *testing.T) {
	root := t.TempDir()
	const uid = "0b5e7c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
	const uidU = "0b5e7c1a_2f3d_4e5f_8a9b_0c1d2e3f4a5b"
	pods := []string{
		"kubepods/pod" + uid,
		"kubepods/burstable/pod" + uid,
		"kubepods/besteffort/pod" + uid,
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice",
		"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidU + ".slice",
	}
	mkdirs(t, root, pods...)
	mkdirs(t, root,
		"kubepods/burstable/pod"+uid+"/0123abcd/nested/deeper/pod"+uid, // inside a pod: not another pod
		"system.slice/pod"+uid,         // no "kube" above it: not read
		"kubepods/burstable/not-a-pod", // no UID
		"kubepods/a/b/c/d/e/f/pod"+uid, // deeper than MaxDepth
	)
	roots := fakeRoots{}
	s := &Scanner{Dir: root, Roots: roots}
	added, removed, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	var want []uint64
	for _, p := range pods {
		id, ok := cgroupID(filepath.Join(root, p))
		if !ok {
			t.Fatal(p)
		}
		want = append(want, id)
	}
	got := make([]uint64, 0, len(roots))
	for id := range roots {
		got = append(got, id)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || added != len(pods) || removed != 0 {
		t.Fatalf("pods %v (added %d, removed %d), want %v", got, added, removed, want)
	}
	if err := os.RemoveAll(filepath.Join(root, pods[0])); err != nil {
		t.Fatal(err)
	}
	if added, removed, err = s.Scan(); err != nil || added != 0 || removed != 1 || len(roots) != len(pods)-1 {
		t.Fatalf("after a pod went: added %d removed %d (%v), %d known; want 0, 1, %d", added, removed, err, len(roots), len(pods)-1)
	}
}

// FindDir reads PID 1's mountinfo: the cgroup2 mount, unified or hybrid,
// seen through PID 1's root; none is an error. (The fallback to the
// agent's own mount is what runs where PID 1's root is hidden.)
func TestFindDir(t *testing.T) {
	for _, tc := range []struct{ mountinfo, want string }{
		{"30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup"},
		{"25 1 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/unified"},
		{"30 1 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n", "/sys/fs/my cgroup"},
		{"30 1 0:26 /../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", ""}, // a namespace's part
		{"30 1 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", ""},
	} {
		proc := t.TempDir()
		mkdirs(t, proc, "1/root"+tc.want, "self")
		for _, pid := range []string{"1", "self"} {
			if err := os.WriteFile(filepath.Join(proc, pid, "mountinfo"), []byte(tc.mountinfo), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := FindDir(proc)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%q: %s, want an error", tc.mountinfo, got)
			}
			continue
		}
		if want := filepath.Join(proc, "1", "root", tc.want); err != nil || got != want {
			t.Errorf("%q: %s %v, want %s", tc.mountinfo, got, err, want)
		}
	}
}

// A process's tenant for the attach shares: its pod, however deep it
// nests cgroups below its container, else its cgroup v2 path.
func TestKey(t *testing.T) {
	const uid = "0b7a3c4e-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	ctr := "cri-containerd-" + strings.Repeat("ab", 32) + ".scope"
	for _, tc := range []struct{ cgroup, want string }{
		{"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/" + ctr + "\n", "pod:" + uid},
		{"0::/kubepods/burstable/pod" + uid + "/" + strings.Repeat("cd", 32) + "/nested/deeper\n", "pod:" + uid},
		{"0::/../../kubepods/pod" + uid + "/" + strings.Repeat("ef", 32) + "\n", "pod:" + uid},
		{"12:memory:/user.slice\n0::/user.slice/user-1000.slice/session-3.scope\n", "cgroup:/user.slice/user-1000.slice/session-3.scope"},
		{"0::/\n", "cgroup:/"},
		{"3:cpu:/legacy\n", ""},
	} {
		if got := Key([]byte(tc.cgroup)); got != tc.want {
			t.Errorf("Key(%q) = %q, want %q", tc.cgroup, got, tc.want)
		}
	}
}
