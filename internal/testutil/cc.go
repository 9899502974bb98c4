package testutil

import (
	"fmt"
	"os/exec"
	"runtime"
)

// Compiler is a C compiler for one target architecture, with the flags
// every fixture of that target gets.
type Compiler struct {
	GOARCH string
	Path   string
	// Flags go first on every command line: arm64 builds have BTI and PAC
	// on (-mbranch-protection=standard), as NVIDIA's arm64 libraries do,
	// so probes are tested on `bti c` and `paciasp` entries.
	Flags []string
}

// compilers are the C compilers by GOARCH: the native gcc when the host
// is that architecture, else the Debian cross compiler.
var compilers = map[string]struct {
	native, cross string
	flags         []string
}{
	"amd64": {"gcc", "x86_64-linux-gnu-gcc", nil},
	"arm64": {"gcc", "aarch64-linux-gnu-gcc", []string{"-mbranch-protection=standard"}},
}

// CC returns the C compiler that builds fixtures for goarch. An error
// wraps ErrNoCompiler when it is not installed.
func CC(goarch string) (Compiler, error) {
	c, ok := compilers[goarch]
	if !ok {
		return Compiler{}, fmt.Errorf("testutil: no C compiler known for GOARCH %s", goarch)
	}
	name := c.cross
	if goarch == runtime.GOARCH {
		name = c.native
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return Compiler{}, fmt.Errorf("testutil: %s for %s: %w", name, goarch, ErrNoCompiler)
	}
	return Compiler{GOARCH: goarch, Path: path, Flags: c.flags}, nil
}

// Command is the compiler run with its flags, then args.
func (c Compiler) Command(args ...string) *exec.Cmd {
	return exec.Command(c.Path, append(append([]string(nil), c.Flags...), args...)...)
}
