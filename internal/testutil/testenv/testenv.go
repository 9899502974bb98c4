// Package testenv is what every test helper package shares: the variable
// that makes a missing privilege a failure, where the cached tools live,
// the repository root, and polling. It knows no domain (CUDA workloads are
// package testutil's, the API server kubetest's, certificates certtest's,
// promtool promtest's).
package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// E2EEnv is the variable that turns a missing privilege or kernel feature
// from a skip into a failure, so a CI lane cannot pass by skipping.
const E2EEnv = "PROFI_E2E"

// Where the tools the scripts build are cached.
const (
	// ToolsCacheEnv overrides DefaultToolsCache, the directory that
	// scripts/build-kube.sh, scripts/build-helm.sh and
	// scripts/fetch-nvidia.sh fill.
	ToolsCacheEnv     = "PROFI_TOOLS_CACHE"
	DefaultToolsCache = "/var/cache/profi-tools"
)

// ToolsCache is $PROFI_TOOLS_CACHE, or DefaultToolsCache.
func ToolsCache() string {
	if c := os.Getenv(ToolsCacheEnv); c != "" {
		return c
	}
	return DefaultToolsCache
}

// Executable returns nil if p is an executable regular file.
func Executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// Eventually polls cond every 100 ms until it returns nil or timeout
// passes, and returns the last error.
func Eventually(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ModulePath is the module whose root RepoRoot looks for.
const ModulePath = "github.com/profi-dev/profi"

// RepoRoot finds the module root (the directory whose go.mod declares
// ModulePath), so sources are found from any package's tests. It starts from
// this source file's directory, which works from any working directory, and
// falls back to the working directory for -trimpath builds.
func RepoRoot() (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, d := range starts {
		for {
			if isModuleRoot(d) {
				return d, nil
			}
			parent := filepath.Dir(d)
			if parent == d {
				break
			}
			d = parent
		}
	}
	return "", fmt.Errorf("testenv: no go.mod for module %s above %v", ModulePath, starts)
}

func isModuleRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == ModulePath
		}
	}
	return false
}
