package kernelname

import (
	"errors"
	"testing"
)

func TestFromDeviceStub(t *testing.T) {
	for sym, want := range map[string]string{
		"__device_stub__Z4gemmPf":                    "_Z4gemmPf",
		"__device_stub__Z13launch13_gemmPf":          "_Z13launch13_gemmPf",
		"__device_stub__ZN5flash7fwd_mhaILi128EEEvv": "_ZN5flash7fwd_mhaILi128EEEvv",
	} {
		if got, err := FromDeviceStub(sym); err != nil || got != want {
			t.Errorf("FromDeviceStub(%q) = %q, %v; want %q", sym, got, err, want)
		}
	}
	for _, sym := range []string{"main", "", "__device_stub_", "_Z4gemmPf", "launch_all"} {
		if got, err := FromDeviceStub(sym); !errors.Is(err, ErrNotDeviceStub) {
			t.Errorf("FromDeviceStub(%q) = %q, %v; want ErrNotDeviceStub", sym, got, err)
		}
	}
}
