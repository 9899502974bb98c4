package discover

import (
	"bufio"
	"fmt"
	"io"
	"os"
)

// SelfFileOffset converts an address in the agent's own executable (a
// function it probes itself, where test binaries and stripped builds have
// no symbol) into the file offset a uprobe takes, from the mapping of
// /proc/self/maps that contains it.
func SelfFileOffset(addr uintptr) (uint64, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("read own maps: %w", err)
	}
	defer f.Close()
	return fileOffset(f, uint64(addr))
}

// fileOffset is SelfFileOffset over the maps text read from r.
func fileOffset(r io.Reader, addr uint64) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		e, ok, err := ParseMapsLine(sc.Text())
		if err != nil || !ok {
			continue
		}
		if addr >= e.Start && addr < e.End {
			return addr - e.Start + e.Offset, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read own maps: %w", err)
	}
	return 0, fmt.Errorf("address %#x not in any file mapping of the agent", addr)
}
