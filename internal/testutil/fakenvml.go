package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// fakeNVMLSrc is the fake NVML library of the e2e tests.
const fakeNVMLSrc = "test/stubs/fakenvml.c"

// FakeNVMLScenarioEnv names the scenario file the fake NVML reads.
const FakeNVMLScenarioEnv = "PROFI_FAKE_NVML_SCENARIO"

// BuildFakeNVML compiles test/stubs/fakenvml.c into dir/libnvidia-ml.so.1
// and returns its path. It includes NVIDIA's nvml.h from the go-nvml module
// the agent links (go list finds it in the module cache), so the fake has
// NVIDIA's declarations and struct layouts and the header is never copied
// into this repository.
func BuildFakeNVML(dir string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	cc, err := CC(runtime.GOARCH)
	if err != nil {
		return "", err
	}
	list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("find go-nvml's nvml.h: %w", err)
	}
	include := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	cmd := cc.Command(append(append([]string{"-O2", "-shared", "-fPIC"}, warnFlags...),
		"-I", include, "-Wl,-soname,libnvidia-ml.so.1", "-o", lib, filepath.Join(root, fakeNVMLSrc))...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build fake NVML: %w\n%s", err, b)
	}
	return lib, nil
}

// WriteScenario replaces the fake NVML's scenario file atomically (a new
// inode, which the fake notices).
func WriteScenario(path, text string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
