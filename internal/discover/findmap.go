package discover

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
)

// ErrNoFileMapping is returned by FindMapping when no file mapping of the
// process contains the address (an anonymous mapping, the heap, nothing).
var ErrNoFileMapping = errors.New("no file mapping contains the address")

// FindMapping returns the file mapping of pid's /proc/PID/maps that
// contains addr. Lines longer than the buffer and malformed lines are
// skipped. A missing process wraps ErrProcessGone.
func FindMapping(procRoot string, pid int, addr uint64) (MapsEntry, error) {
	f, err := os.Open(procRootOr(procRoot) + "/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return MapsEntry{}, fmt.Errorf("find mapping of 0x%x in pid %d: %w: %w", addr, pid, ErrProcessGone, err)
		}
		return MapsEntry{}, fmt.Errorf("find mapping of 0x%x in pid %d: %w", addr, pid, err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 8<<10)
	for {
		line, err := br.ReadSlice('\n')
		for err == bufio.ErrBufferFull {
			_, err = br.ReadSlice('\n')
			line = nil
		}
		if len(line) > 0 {
			e, ok, perr := ParseMapsLine(string(line))
			if perr == nil && ok && e.Start <= addr && addr < e.End {
				return e, nil
			}
		}
		if err == io.EOF {
			return MapsEntry{}, fmt.Errorf("find mapping of 0x%x in pid %d: %w", addr, pid, ErrNoFileMapping)
		}
		if err != nil {
			return MapsEntry{}, fmt.Errorf("find mapping of 0x%x in pid %d: %w", addr, pid, err)
		}
	}
}
