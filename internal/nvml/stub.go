//go:build !(cgo && linux)

package nvml

import "fmt"

// NewLibrary returns a Library whose Init always fails: NVML needs cgo on
// Linux (go-nvml is a cgo binding), and this build has neither.
func NewLibrary() Library { return stub{} }

type stub struct{}

func (stub) Init() error {
	return fmt.Errorf("%w: this build of profi has no NVML support (needs cgo on linux)", ErrLibraryNotFound)
}
func (stub) Shutdown() error                { return nil }
func (stub) DriverVersion() (string, error) { return "", ErrNotSupported }
func (stub) DeviceCount() (int, error)      { return 0, ErrNotSupported }
func (stub) Device(int) (Device, error)     { return nil, ErrNotSupported }
func (stub) NewEventSet() (EventSet, error) { return nil, ErrNotSupported }
func (stub) GPMMetrics(GPMSample, GPMSample, []GPMMetric) (map[GPMMetric]float64, error) {
	return nil, ErrNotSupported
}
