package k8s

import (
	"strings"
	"testing"
)

const (
	uid   = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
	uidUS = "1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901"
	cid   = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestParseCgroup(t *testing.T) {
	tests := []struct {
		name, content string
		ok            bool
	}{
		{"containerd v2 systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidUS + ".slice/cri-containerd-" + cid + ".scope\n", true},
		{"containerd v2 guaranteed", "0::/kubepods.slice/kubepods-pod" + uidUS + ".slice/cri-containerd-" + cid + ".scope\n", true},
		{"CRI-O v2", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidUS + ".slice/crio-" + cid + ".scope\n", true},
		{"Docker v2 systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidUS + ".slice/docker-" + cid + ".scope\n", true},
		{"cgroupfs v2", "0::/kubepods/burstable/pod" + uid + "/" + cid + "\n", true},
		{"cgroupfs guaranteed", "0::/kubepods/pod" + uid + "/" + cid + "\n", true},
		{"cgroup v1 lines", "12:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n11:memory:/kubepods/besteffort/pod" + uid + "/" + cid + "\n1:name=systemd:/kubepods/besteffort/pod" + uid + "/" + cid + "\n", true},
		{"v1 with empty first controllers", "13:rdma:/\n12:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidUS + ".slice/cri-containerd-" + cid + ".scope\n", true},
		{"nested in kind", "0::/system.slice/docker-aaaa.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidUS + ".slice/cri-containerd-" + cid + ".scope\n", true},
		{"CRI-O conmon", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidUS + ".slice/crio-conmon-" + cid + ".scope\n", false},
		{"pod cgroup only", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidUS + ".slice\n", false},
		{"host process", "0::/user.slice/user-0.slice/session-1.scope\n", false},
		{"short id", "0::/kubepods/pod" + uid + "/0123abcd\n", false},
		{"uppercase id", "0::/kubepods/pod" + uid + "/" + strings.ToUpper(cid) + "\n", false},
		{"empty", "", false},
		{"garbage", "no colons here\n::\n0:", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := ParseCgroup([]byte(tt.content))
			if ok != tt.ok {
				t.Fatalf("ok = %v (%+v), want %v", ok, c, tt.ok)
			}
			if ok && (c.PodUID != uid || c.ID != cid) {
				t.Errorf("got %+v, want pod %s container %s", c, uid, cid)
			}
		})
	}
}

func TestTrimRuntime(t *testing.T) {
	for in, want := range map[string]string{"containerd://" + cid: cid, "cri-o://" + cid: cid, "docker://" + cid: cid, cid: cid, "": ""} {
		if got := TrimRuntime(in); got != want {
			t.Errorf("TrimRuntime(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParseCgroup(f *testing.F) {
	f.Add([]byte("0::/kubepods/burstable/pod" + uid + "/" + cid + "\n"))
	f.Add([]byte("0::/kubepods.slice/kubepods-pod" + uidUS + ".slice/cri-containerd-" + cid + ".scope\n"))
	f.Add([]byte("12:memory:/kubepods/pod" + uid + "/" + cid))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ok := ParseCgroup(b)
		if ok && (!isUID(c.PodUID) || len(c.ID) != 64) {
			t.Errorf("ParseCgroup(%q) = %+v: malformed result", b, c)
		}
	})
}
