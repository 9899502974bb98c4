package kernelname

import (
	"errors"
	"strings"
)

// nvcc compiles each __global__ function K into a host function named K
// (its mangled name, the "host stub" registration and __cudaGetKernel
// take) that calls deviceStubPrefix + K, and that function makes the
// launch call (__cudaLaunchKernel in CUDA 13, cudaLaunchKernel before). So
// the symbol around a launch's call site names the kernel.

// ErrNotDeviceStub is returned by FromDeviceStub for a call site in any
// other function (hand-written launch code): its name is not the kernel's.
var ErrNotDeviceStub = errors.New("call site is not an nvcc __device_stub_ function")

// FromDeviceStub returns the kernel's raw (mangled) name from the symbol of
// the function a launch was called from: __device_stub__Z4gemmPf gives
// _Z4gemmPf.
func FromDeviceStub(sym string) (string, error) {
	k, ok := strings.CutPrefix(sym, deviceStubPrefix)
	if !ok || k == "" {
		return "", ErrNotDeviceStub
	}
	return k, nil
}
