package testutil

import (
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// WriteHostileELF writes a crafted shared object to path as a sparse
// file: a valid ELF64 header, one executable PT_LOAD, and a .dynsym of
// dynsymBytes apparent size (holes: a few KiB on disk whatever the size)
// (rounded down to whole 24-byte symbols) with a 4 KiB .dynstr after it. It is the file of issue 17's first
// attack: debug/elf allocated about six times the apparent size parsing it.
func WriteHostileELF(path string, dynsymBytes int64) error {
	const (
		shoff  = 0x1000
		dynsym = 0x10000
		strtab = 4096
	)
	if dynsymBytes < 0 {
		return fmt.Errorf("hostile ELF: .dynsym size %d", dynsymBytes)
	}
	dynsymBytes -= dynsymBytes % 24
	le := binary.LittleEndian
	var eh [64]byte
	copy(eh[:], []byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)})
	le.PutUint16(eh[16:], uint16(elf.ET_DYN))
	le.PutUint16(eh[18:], uint16(hostMachine())) // a file the attacher would probe
	le.PutUint32(eh[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(eh[32:], 64)    // e_phoff
	le.PutUint64(eh[40:], shoff) // e_shoff
	le.PutUint16(eh[52:], 64)
	le.PutUint16(eh[54:], 56)
	le.PutUint16(eh[56:], 1)
	le.PutUint16(eh[58:], 64)
	le.PutUint16(eh[60:], 3)
	var ph [56]byte
	le.PutUint32(ph[0:], uint32(elf.PT_LOAD))
	le.PutUint32(ph[4:], uint32(elf.PF_R|elf.PF_X))
	le.PutUint64(ph[32:], dynsym) // p_filesz
	le.PutUint64(ph[40:], dynsym) // p_memsz
	sh := make([]byte, 3*64)
	le.PutUint32(sh[64+4:], uint32(elf.SHT_DYNSYM))
	le.PutUint64(sh[64+24:], dynsym)
	le.PutUint64(sh[64+32:], uint64(dynsymBytes))
	le.PutUint32(sh[64+40:], 2)
	le.PutUint64(sh[64+56:], 24)
	le.PutUint32(sh[128+4:], uint32(elf.SHT_STRTAB))
	le.PutUint64(sh[128+24:], uint64(dynsym+dynsymBytes))
	le.PutUint64(sh[128+32:], strtab)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	for _, w := range []struct {
		b   []byte
		off int64
	}{{eh[:], 0}, {ph[:], 64}, {sh, shoff}} {
		if _, err := f.WriteAt(w.b, w.off); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Truncate(dynsym + dynsymBytes + strtab); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// HostileTruth is what the hostile workload (Fixtures.Hostile) did in one
// run: N calls in each of its four phases.
type HostileTruth struct {
	N        int `json:"n"`
	Streams  int `json:"streams"`  // async copies, one per fake stream handle, rc 0
	Launches int `json:"launches"` // launches on the same stream handles
	Mallocs  int `json:"mallocs"`  // 4096-byte allocations, never freed
	Errors   int `json:"errors"`   // async copies on the default stream, rc 1..N
}

// RunHostile runs the hostile workload's phases ("go") and returns what it did.
func (w *Workload) RunHostile() (*HostileTruth, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("go"); err != nil {
		return nil, err
	}
	line, err := w.waitLine(w.opts.runTimeout, "hostile summary JSON")
	if err != nil {
		return nil, err
	}
	var h HostileTruth
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, w.errorf("bad hostile summary %q: %v", line, err)
	}
	return &h, nil
}

// RunHostileCommand sends the hostile workload one of its other commands
// ("captures N", "graphids N") and returns its summary: what it did, by name.
func (w *Workload) RunHostileCommand(cmd string) (map[string]int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(cmd); err != nil {
		return nil, err
	}
	line, err := w.waitLine(w.opts.runTimeout, "hostile summary JSON")
	if err != nil {
		return nil, err
	}
	var h map[string]int
	if err := json.Unmarshal([]byte(line), &h); err != nil {
		return nil, w.errorf("bad hostile summary %q: %v", line, err)
	}
	return h, nil
}

// hostMachine is the ELF machine of the host's code.
func hostMachine() elf.Machine {
	if runtime.GOARCH == "arm64" {
		return elf.EM_AARCH64
	}
	return elf.EM_X86_64
}
