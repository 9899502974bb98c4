//go:build !(linux && (amd64 || arm64))

package budget

import (
	"errors"
	"time"
)

// Calibrate needs Linux on amd64 or arm64 (its probe target is assembly).
func Calibrate() (time.Duration, error) {
	return 0, errors.ErrUnsupported
}
