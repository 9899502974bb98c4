//go:build !(linux && amd64)

package budget

import (
	"errors"
	"time"
)

// Calibrate needs Linux on amd64 (its probe target is amd64 assembly).
func Calibrate() (time.Duration, error) {
	return 0, errors.ErrUnsupported
}
