package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// TestImageBothArchitectures builds the image for x86-64 and arm64 (NVIDIA
// Grace) and the manifest list naming both, as `make image` does
// (scripts/build-image.sh --manifest), and proves each image runs: the
// one of this machine's architecture under podman, the other under
// qemu-user with the image's own root filesystem as the only place it may
// find its loader and C library (qemu-aarch64 -L): a cross-built cgo agent
// whose interpreter or glibc the image lacked fails here, not on a node.
// The agent's eBPF work on arm64 is the VM matrix's (test/vm); this test is
// about what ships.
func TestImageBothArchitectures(t *testing.T) {
	p := requirePodman(t)
	foreign := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	qemuName := map[string]string{"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}[foreign]
	qemu, err := exec.LookPath(qemuName)
	if err != nil {
		if os.Getenv(testenv.E2EEnv) == "1" {
			t.Fatalf("%s not found (Debian package qemu-user; scripts/test-setup.sh installs it) and %s=1 forbids skipping", qemuName, testenv.E2EEnv)
		}
		t.Skipf("skipping: %s not found (Debian package qemu-user)", qemuName)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	const list, version = "localhost/profi:multi", "e2e-multi"
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// This machine's architecture from the agent the other tests run; the
	// other one cross-built with cgo by the script, as `make image` does.
	out, code := p.run(ctx, filepath.Join(root, "scripts/build-image.sh"), "--manifest", list, "--version", version,
		"--binary-"+runtime.GOARCH, agentBin)
	if code != 0 {
		t.Fatalf("scripts/build-image.sh --manifest: exit %d\n%s", code, out)
	}
	t.Logf("both images and the manifest list built in %v", time.Since(start).Round(time.Second))

	var idx struct {
		Manifests []struct {
			Platform struct{ Architecture, OS string }
		}
	}
	if err := json.Unmarshal([]byte(p.must(t, "buildah", "manifest", "inspect", list)), &idx); err != nil {
		t.Fatalf("manifest inspect %s: %v", list, err)
	}
	var platforms []string
	for _, m := range idx.Manifests {
		platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	slices.Sort(platforms)
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Fatalf("manifest list %s names %v, want %v", list, platforms, want)
	}

	for _, arch := range []string{"amd64", "arm64"} {
		image := list + "-" + arch
		if got := strings.TrimSpace(p.must(t, "buildah", "inspect", "--format", "{{.OCIv1.Architecture}}", image)); got != arch {
			t.Fatalf("%s: architecture %q, want %q", image, got, arch)
		}
		// The agent the other tests run says its own version.
		want := version
		argv := []string{"podman", "run", "--rm", "--pull=never", "--network=none", image, "--version"}
		if arch != foreign {
			v, err := exec.Command(agentBin, "--version").Output()
			if err != nil {
				t.Fatalf("%s --version: %v", agentBin, err)
			}
			want = strings.TrimSpace(string(v))
		} else {
			ctr := strings.TrimSpace(p.must(t, "buildah", "from", "--pull=never", "--arch", arch, image))
			t.Cleanup(func() { _, _ = p.run(context.Background(), "buildah", "rm", ctr) })
			mnt := strings.TrimSpace(p.must(t, "buildah", "mount", ctr))
			argv = []string{qemu, "-L", mnt, filepath.Join(mnt, "usr/bin/profi"), "--version"}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got, code := p.run(ctx, argv...)
		cancel()
		if code != 0 || strings.TrimSpace(got) != want {
			t.Fatalf("%s: %s: exit %d, output %q; want exit 0 and %q", image, strings.Join(argv, " "), code, got, want)
		}
	}
}
