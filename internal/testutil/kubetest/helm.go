package kubetest

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/profi-dev/profi/internal/testutil/testenv"
)

const (
	// HelmEnv names a helm binary to use instead of the cached one.
	HelmEnv = "PROFI_HELM"
	// HelmVersion is the version scripts/build-helm.sh builds by default.
	HelmVersion = "v3.22.0"
)

// HelmBinary returns the helm to run: $PROFI_HELM, or the one
// scripts/build-helm.sh cached under $PROFI_TOOLS_CACHE (default
// /var/cache/profi-tools)/helm-VERSION/.
func HelmBinary() (string, error) {
	if p := os.Getenv(HelmEnv); p != "" {
		if err := testenv.Executable(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", HelmEnv, p, err)
		}
		return p, nil
	}
	cache := testenv.ToolsCache()
	p := filepath.Join(cache, "helm-"+HelmVersion, "helm")
	if err := testenv.Executable(p); err != nil {
		return "", fmt.Errorf("helm %s is not built (%w): run scripts/build-helm.sh (about 6 minutes), or set %s", HelmVersion, err, HelmEnv)
	}
	return p, nil
}
