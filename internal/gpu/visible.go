package gpu

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/profi-dev/profi/internal/nvml"
)

// Device is one GPU a process can see, as labels: Index is the NVML index
// (-1 when unknown), UUID the GPU-… UUID, or the MIG-… UUID of a MIG
// device ("" when unknown).
type Device struct {
	Index int
	UUID  string
}

// Labels returns the gpu and gpu_uuid label values.
func (d Device) Labels() (gpu, uuid string) {
	if d.Index >= 0 {
		gpu = strconv.Itoa(d.Index)
	}
	return gpu, d.UUID
}

// list is what a process can see, in CUDA ordinal order. identity means
// "every GPU of the node, count unknown": NVML is not available and no
// variable restricts the devices, so ordinal i is GPU i.
type list struct {
	devs     []Device
	identity bool
}

// ordinal returns the device of CUDA ordinal i.
func (l list) ordinal(i int) (Device, bool) {
	if l.identity {
		return Device{Index: i}, i >= 0
	}
	if i < 0 || i >= len(l.devs) {
		return Device{Index: -1}, false
	}
	return l.devs[i], true
}

// inventory is the node's GPUs from NVML, nil when NVML is not up.
func inventory(s *nvml.Snapshot) []nvml.GPU {
	if s == nil || !s.Up {
		return nil
	}
	return s.GPUs
}

// Visible returns the devices a process with these environment variables
// sees, in CUDA ordinal order (see Resolve).
//
//   - NVIDIA_VISIBLE_DEVICES is applied by the NVIDIA container runtime: it
//     chooses which GPUs the container gets (indices, GPU-/MIG- UUIDs, all;
//     none, void or empty: none). Inside the container CUDA enumerates them
//     in the node's (NVML, PCI bus) order, whatever the order of the list.
//   - CUDA_VISIBLE_DEVICES then selects and orders among those: a decimal
//     entry is an ordinal of that enumeration, GPU-… a UUID (or a unique
//     prefix), MIG-… a MIG device. As in CUDA, the first invalid entry (not
//     a number nor a UUID, out of range, unknown or repeated) ends the list;
//     an empty value hides every GPU.
//
// gpus is NVML's inventory; nil without NVML, when numbers are taken as
// NVML indices and UUIDs as given (they cannot be checked).
func Visible(cudaVisible, nvidiaVisible *string, gpus []nvml.GPU) []Device {
	return visible(cudaVisible, nvidiaVisible, gpus).devs
}

func visible(cudaVisible, nvidiaVisible *string, gpus []nvml.GPU) list {
	if tooLong(cudaVisible) || tooLong(nvidiaVisible) {
		// No real list is this long (see maxVisibleLen): nothing in it
		// is believed, every device is unknown.
		return list{devs: []Device{}}
	}
	base := list{identity: gpus == nil}
	for _, g := range gpus {
		base.devs = append(base.devs, Device{Index: g.Index, UUID: g.UUID})
	}
	if nvidiaVisible != nil {
		base = containerDevices(*nvidiaVisible, base, gpus)
	}
	if cudaVisible == nil {
		return base
	}
	out := list{devs: []Device{}}
	seen := map[seenKey]bool{}
	for e := range strings.SplitSeq(*cudaVisible, ",") {
		e = strings.TrimSpace(e)
		d, ok := entry(e, base, gpus)
		if !ok || seen[keyOf(d, e)] {
			break
		}
		seen[keyOf(d, e)] = true
		out.devs = append(out.devs, d)
	}
	return out
}

// seenKey tells list entries apart: by device, or, for a device known only
// by a UUID prefix (no NVML, no label), by the entry itself.
type seenKey struct {
	d   Device
	raw string
}

func keyOf(d Device, e string) seenKey {
	if d.Index < 0 && d.UUID == "" {
		return seenKey{d: d, raw: e}
	}
	return seenKey{d: d}
}

// containerDevices applies NVIDIA_VISIBLE_DEVICES: a set of GPUs, sorted in
// the node's order. Entries the runtime would refuse are skipped.
func containerDevices(v string, base list, gpus []nvml.GPU) list {
	switch strings.TrimSpace(v) {
	case "all":
		return base
	case "", "none", "void":
		return list{devs: []Device{}}
	}
	out := list{devs: []Device{}}
	seen := map[seenKey]bool{}
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		d, ok := entry(e, base, gpus)
		if ok && !seen[keyOf(d, e)] {
			seen[keyOf(d, e)] = true
			out.devs = append(out.devs, d)
		}
	}
	// Known indices in node order; devices only known by UUID (no NVML)
	// keep their place after them.
	slices.SortStableFunc(out.devs, func(a, b Device) int {
		switch {
		case a.Index < 0 && b.Index < 0:
			return 0
		case a.Index < 0:
			return 1
		case b.Index < 0:
			return -1
		}
		return cmp.Compare(a.Index, b.Index)
	})
	return out
}

// entry resolves one list entry against the devices of base.
func entry(e string, base list, gpus []nvml.GPU) (Device, bool) {
	switch {
	case e == "":
		return Device{}, false
	case isDigits(e):
		i, err := strconv.Atoi(e)
		if err != nil {
			return Device{}, false
		}
		return base.ordinal(i)
	case strings.HasPrefix(e, "GPU-"):
		if gpus == nil {
			return unchecked(e)
		}
		var found []Device
		for _, d := range base.devs {
			if strings.HasPrefix(d.UUID, e) {
				found = append(found, d)
			}
		}
		if len(found) != 1 {
			return Device{}, false // unknown, or an ambiguous prefix
		}
		return found[0], true
	case strings.HasPrefix(e, "MIG-"):
		if gpus == nil {
			return unchecked(e)
		}
		for _, g := range gpus {
			if !base.has(g.Index) {
				continue
			}
			for _, m := range g.MIGDevices {
				if m.UUID == e || strings.HasPrefix(m.UUID, e) {
					return Device{Index: g.Index, UUID: m.UUID}, true
				}
			}
		}
		return Device{}, false
	}
	return Device{}, false
}

// unchecked is a UUID entry without NVML to check it against. Only a
// UUID in NVIDIA's format becomes a label; a shorter prefix of one is a
// device whose UUID is unknown (CUDA accepts unique prefixes); anything
// else cannot name a real device, so, as in CUDA, it is invalid.
func unchecked(e string) (Device, bool) {
	switch uuidForm(e) {
	case uuidFull:
		return Device{Index: -1, UUID: e}, true
	case uuidPrefix:
		return Device{Index: -1}, true
	}
	return Device{}, false
}

// has reports whether the GPU of NVML index i is among the list's devices.
func (l list) has(i int) bool {
	if l.identity {
		return true
	}
	for _, d := range l.devs {
		if d.Index == i {
			return true
		}
	}
	return false
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
