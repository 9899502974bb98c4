package gpu

import "strings"

// maxVisibleLen bounds CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES:
// a MIG UUID in the older form is 56 bytes, so 16 KiB lists more devices
// than any node has. A longer value is not believed at all.
const maxVisibleLen = 16 << 10

func tooLong(v *string) bool { return v != nil && len(*v) > maxVisibleLen }

// Forms of a GPU-/MIG- entry, by uuidForm.
const (
	uuidInvalid = iota // cannot be (a prefix of) a UUID of NVIDIA's formats
	uuidPrefix         // a proper prefix of one
	uuidFull           // a complete UUID
)

// uuidForm classifies e against NVIDIA's UUID formats (nvidia-smi -L,
// NVML; MIG user guide, "CUDA Device Enumeration"):
//
//	GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx    a GPU
//	MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx    a MIG device (driver R470+)
//	MIG-GPU-xxxxxxxx-…-xxxxxxxxxxxx/GI/CI       a MIG device (older drivers)
//
// where x is a hex digit and GI, CI are GPU and compute instance ids.
func uuidForm(e string) int {
	rest, ok := strings.CutPrefix(e, "GPU-")
	if !ok {
		if rest, ok = strings.CutPrefix(e, "MIG-"); !ok {
			return uuidInvalid
		}
		if old, isOld := strings.CutPrefix(rest, "GPU-"); isOld {
			return migOldForm(old)
		}
		if strings.HasPrefix("GPU-", rest) && rest != "" {
			return uuidPrefix // "MIG-G", "MIG-GP", "MIG-GPU"
		}
	}
	n, full := hexUUID(rest)
	switch {
	case full && n == len(rest):
		return uuidFull
	case n == len(rest):
		return uuidPrefix
	}
	return uuidInvalid
}

// migOldForm classifies what follows "MIG-GPU-": a UUID, then /GI/CI.
func migOldForm(s string) int {
	n, full := hexUUID(s)
	if n == len(s) {
		return uuidPrefix
	}
	if !full || s[n] != '/' {
		return uuidInvalid
	}
	ids := s[n+1:]
	if ids == "" {
		return uuidPrefix
	}
	gi, ci, two := strings.Cut(ids, "/")
	switch {
	case !instanceID(gi):
		return uuidInvalid
	case !two || ci == "":
		return uuidPrefix
	case instanceID(ci):
		return uuidFull
	}
	return uuidInvalid
}

// instanceID is a GPU or compute instance id: 1 to 3 decimal digits.
func instanceID(s string) bool { return len(s) <= 3 && isDigits(s) }

// hexUUID reports how many leading bytes of s follow the 8-4-4-4-12 hex
// pattern, and whether those make a complete UUID.
func hexUUID(s string) (n int, full bool) {
	const pattern = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	for n < len(s) && n < len(pattern) {
		c := s[n]
		if pattern[n] == '-' {
			if c != '-' {
				break
			}
		} else if !isHex(c) {
			break
		}
		n++
	}
	return n, n == len(pattern)
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// rejectedEntries counts what of a process's two variables cannot be
// believed: a value over maxVisibleLen (one), or each GPU-/MIG- entry that
// is neither a UUID of NVIDIA's formats nor a prefix of one. Such input
// never becomes a label; the count feeds
// profi_system_rejected_label_values_total{label="gpu_uuid"}.
func rejectedEntries(vars ...*string) uint64 {
	var n uint64
	for _, v := range vars {
		switch {
		case v == nil:
		case tooLong(v):
			n++
		default:
			for e := range strings.SplitSeq(*v, ",") {
				e = strings.TrimSpace(e)
				if (strings.HasPrefix(e, "GPU-") || strings.HasPrefix(e, "MIG-")) && uuidForm(e) == uuidInvalid {
					n++
				}
			}
		}
	}
	return n
}
