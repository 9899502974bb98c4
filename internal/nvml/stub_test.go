//go:build !(cgo && linux)

package nvml

import (
	"errors"
	"testing"
)

func TestStubLibrary(t *testing.T) {
	t.Parallel()
	lib := NewLibrary()
	if err := lib.Init(); !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("Init() = %v, want ErrLibraryNotFound", err)
	}
	if _, err := lib.DeviceCount(); !errors.Is(err, ErrNotSupported) {
		t.Errorf("DeviceCount() = %v, want ErrNotSupported", err)
	}
}
