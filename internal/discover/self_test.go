package discover

import (
	"strings"
	"testing"
)

func TestFileOffset(t *testing.T) {
	const maps = "00400000-00452000 r--p 00000000 08:02 173521 /usr/bin/agent\n" +
		"00452000-00500000 r-xp 00052000 08:02 173521 /usr/bin/agent\n" +
		"7ffd0000-7ffe0000 rw-p 00000000 00:00 0 [stack]\n"
	for _, tc := range []struct {
		addr, want uint64
		ok         bool
	}{
		{0x400010, 0x10, true},
		{0x452000, 0x52000, true},
		{0x4fffff, 0x52000 + 0xadfff, true},
		{0x500000, 0, false},   // past the last file mapping
		{0x7ffd0100, 0, false}, // anonymous
	} {
		got, err := fileOffset(strings.NewReader(maps), tc.addr)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("fileOffset(%#x) = %#x, %v; want %#x, ok %v", tc.addr, got, err, tc.want, tc.ok)
		}
	}
}
