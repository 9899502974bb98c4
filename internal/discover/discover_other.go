//go:build !linux

package discover

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// errUnsupported is returned by everything that needs Linux procfs.
var errUnsupported = fmt.Errorf("discover: procfs scanning needs Linux: %w", errors.ErrUnsupported)

// Scan needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func (s *Scanner) Scan() (*Result, error) { return nil, errUnsupported }

// ListPIDs needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func ListPIDs(procRoot string) ([]int, error) { return nil, errUnsupported }

// ReadComm needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func ReadComm(procRoot string, pid int) (string, error) { return "", errUnsupported }

// ReadStartTime needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func ReadStartTime(procRoot string, pid int) (uint64, error) { return 0, errUnsupported }

// ReadCPUTime needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func ReadCPUTime(procRoot string, pid int) (time.Duration, uint64, error) {
	return 0, 0, errUnsupported
}

// Alive needs Linux; elsewhere it reports false.
func Alive(procRoot string, pid int, startTime uint64) bool { return false }

// OpenInRoot needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func OpenInRoot(procRoot string, pid int, path string) (*os.File, error) {
	return nil, errUnsupported
}

// FileID needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func FileID(f *os.File) (dev, ino uint64, err error) { return 0, 0, errUnsupported }

// Proc needs Linux; elsewhere OpenProc returns an error wrapping
// errors.ErrUnsupported.
type Proc struct{ pid int }

// OpenProc needs Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func OpenProc(procRoot string, pid int, start uint64) (*Proc, error) { return nil, errUnsupported }

// PID is the process's PID.
func (p *Proc) PID() int { return p.pid }

// Close does nothing.
func (p *Proc) Close() error { return nil }

// Open needs Linux.
func (p *Proc) Open(name string) (io.ReadCloser, error) { return nil, errUnsupported }

// ReadFile needs Linux.
func (p *Proc) ReadFile(name string, max int) ([]byte, error) { return nil, errUnsupported }

// StartTime needs Linux.
func (p *Proc) StartTime() (uint64, error) { return 0, errUnsupported }

// Comm needs Linux.
func (p *Proc) Comm() (string, error) { return "", errUnsupported }

// FDTargets needs Linux.
func (p *Proc) FDTargets() ([]string, error) { return nil, errUnsupported }
