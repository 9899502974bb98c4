package k8s

import (
	"bufio"
	"bytes"
	"strings"
)

// Container identifies a process's container from its cgroup path.
type Container struct {
	PodUID string // with dashes, as the API server spells it
	ID     string // 64 hex digits, without the runtime prefix
}

// ParseCgroup finds the pod UID and container ID in the contents of a
// /proc/PID/cgroup file. It accepts every line format (v1
// "N:controllers:/path", v2 "0::/path") and these kubelet layouts, also
// nested below other cgroups (kind, systemd user slices):
//
//	systemd: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
//	         ... crio-<id>.scope, docker-<id>.scope
//	cgroupfs: kubepods/burstable/pod<uid>/<id>, kubepods/pod<uid>/<id> (guaranteed)
//
// Runtime helpers (crio-conmon-<id>.scope) and pod-level cgroups without a
// container are not containers: ok is false for them.
func ParseCgroup(content []byte) (c Container, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(content))
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	for sc.Scan() {
		line := sc.Text()
		// The path is everything after the second colon.
		i := strings.IndexByte(line, ':')
		if i < 0 {
			continue
		}
		j := strings.IndexByte(line[i+1:], ':')
		if j < 0 {
			continue
		}
		if c, ok := parsePath(line[i+1+j+1:]); ok {
			return c, true
		}
	}
	return Container{}, false
}

// parsePath finds a pod segment and, right after it, a container segment.
func parsePath(path string) (Container, bool) {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		uid, ok := podUID(s)
		if !ok || i+1 >= len(segs) {
			continue
		}
		if id, ok := containerID(segs[i+1]); ok {
			return Container{PodUID: uid, ID: id}, true
		}
	}
	return Container{}, false
}

// IsPodCgroup reports whether name, one directory of a cgroup path, is a
// pod's cgroup as kubelet names it (both drivers, kind's nested kubelet).
func IsPodCgroup(name string) bool {
	_, ok := podUID(name)
	return ok
}

// podUID recognises "pod<uid>" (cgroupfs) and
// "[kubelet-]kubepods[-<qos>]-pod<uid_with_underscores>.slice" (systemd;
// the kubelet- prefix is kind's nested kubelet).
func podUID(seg string) (string, bool) {
	var raw string
	switch {
	case strings.Contains(seg, "kubepods") && strings.HasSuffix(seg, ".slice"):
		k := strings.LastIndex(seg, "-pod")
		if k < 0 {
			return "", false
		}
		raw = strings.ReplaceAll(seg[k+len("-pod"):len(seg)-len(".slice")], "_", "-")
	case strings.HasPrefix(seg, "pod"):
		raw = seg[len("pod"):]
	default:
		return "", false
	}
	if !isUID(raw) {
		return "", false
	}
	return raw, true
}

// isUID reports whether s is a UUID in its 8-4-4-4-12 text form.
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i]) {
				return false
			}
		}
	}
	return true
}

// containerPrefixes are the systemd scope names of container runtimes.
var containerPrefixes = []string{"cri-containerd-", "crio-", "docker-", "containerd-"}

// containerID recognises "<runtime>-<id>.scope" (systemd) and a bare
// "<id>" (cgroupfs).
func containerID(seg string) (string, bool) {
	id := seg
	if strings.HasSuffix(seg, ".scope") {
		id = ""
		for _, p := range containerPrefixes {
			if strings.HasPrefix(seg, p) {
				id = seg[len(p) : len(seg)-len(".scope")]
				break
			}
		}
	}
	if len(id) != 64 {
		return "", false
	}
	for i := 0; i < len(id); i++ {
		if !isHex(id[i]) {
			return "", false
		}
	}
	return id, true
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f'
}

// TrimRuntime strips the "<runtime>://" prefix of a container status's
// containerID ("containerd://<id>", "cri-o://<id>", "docker://<id>").
func TrimRuntime(id string) string {
	if i := strings.Index(id, "://"); i >= 0 {
		return id[i+3:]
	}
	return id
}
