package discover

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseMapsLine(t *testing.T) {
	const cudart = "/usr/local/cuda/lib64/libcudart.so.12.4.127"
	tests := []struct {
		name    string
		line    string
		want    MapsEntry
		ok      bool
		wantErr bool
	}{
		{
			name: "library",
			line: "7f3a2c010000-7f3a2c060000 r-xp 00010000 103:02 1839412                   " + cudart,
			want: MapsEntry{Start: 0x7f3a2c010000, End: 0x7f3a2c060000, Offset: 0x10000, Perms: "r-xp",
				Dev: mkdev(0x103, 0x02), Inode: 1839412, Path: cudart},
			ok: true,
		},
		{
			name: "trailing newline",
			line: "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n",
			want: MapsEntry{Start: 0x400000, End: 0x452000, Perms: "r-xp", Dev: mkdev(8, 2), Inode: 173521, Path: "/usr/bin/dbus-daemon"},
			ok:   true,
		},
		{
			name: "path with spaces",
			line: "7f3000000000-7f3000010000 r--p 00000000 00:2f 42 /opt/my libs/libcudart.so.11.0",
			want: MapsEntry{Start: 0x7f3000000000, End: 0x7f3000010000, Perms: "r--p", Dev: mkdev(0, 0x2f), Inode: 42, Path: "/opt/my libs/libcudart.so.11.0"},
			ok:   true,
		},
		{
			name: "path with trailing space kept",
			line: "1000-2000 r--p 00000000 00:2f 42 /tmp/x ",
			want: MapsEntry{Start: 0x1000, End: 0x2000, Perms: "r--p", Dev: mkdev(0, 0x2f), Inode: 42, Path: "/tmp/x "},
			ok:   true,
		},
		{
			name: "deleted",
			line: "7f2000000000-7f2000010000 r--p 00000000 08:01 900  /usr/local/cuda/lib64/libcudart.so.12 (deleted)",
			want: MapsEntry{Start: 0x7f2000000000, End: 0x7f2000010000, Perms: "r--p", Dev: mkdev(8, 1), Inode: 900,
				Path: "/usr/local/cuda/lib64/libcudart.so.12", Deleted: true},
			ok: true,
		},
		{
			name: "memfd deleted",
			line: "7f2000080000-7f2000090000 rw-s 00000000 00:01 1024 /memfd:cuda-ipc (deleted)",
			want: MapsEntry{Start: 0x7f2000080000, End: 0x7f2000090000, Perms: "rw-s", Dev: mkdev(0, 1), Inode: 1024, Path: "/memfd:cuda-ipc", Deleted: true},
			ok:   true,
		},
		{
			name: "huge numbers",
			line: "ffffffffff600000-ffffffffffffffff --xp ffffffffffffffff fff:fffff 18446744073709551615 /x",
			want: MapsEntry{Start: 0xffffffffff600000, End: 0xffffffffffffffff, Offset: 0xffffffffffffffff, Perms: "--xp",
				Dev: mkdev(0xfff, 0xfffff), Inode: 18446744073709551615, Path: "/x"},
			ok: true,
		},
		{
			name: "upper-case hex and leading zeros",
			line: "00000000000000000000000000ABCDEF-00000000000000000000000000ABCDF0 r--p 0000000000000000000000 0000A:0000B 000000000000000000000042 /y",
			want: MapsEntry{Start: 0xabcdef, End: 0xabcdf0, Perms: "r--p", Dev: mkdev(0xa, 0xb), Inode: 42, Path: "/y"},
			ok:   true,
		},
		{name: "anonymous with trailing space", line: "7f3a2c084000-7f3a2c090000 rw-p 00000000 00:00 0 "},
		{name: "anonymous without trailing space", line: "7f3a2c084000-7f3a2c090000 rw-p 00000000 00:00 0"},
		{name: "anonymous padded", line: "7f3a2c084000-7f3a2c090000 rw-p 00000000 00:00 0                          \n"},
		{name: "heap", line: "55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0                          [heap]"},
		{name: "vsyscall", line: "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]"},
		{name: "named anon", line: "7f0000000000-7f0000001000 rw-p 00000000 00:00 0  [anon:libcuda.so]"},
		{name: "anon inode", line: "7f0000000000-7f0000001000 rw-s 00000000 00:0e 1054  anon_inode:[perf_event]"},
		{name: "pseudo path deleted", line: "7f0000000000-7f0000001000 rw-s 00000000 00:0e 1054  x (deleted)"},

		{name: "empty", line: "", wantErr: true},
		{name: "only newline", line: "\n", wantErr: true},
		{name: "garbage", line: "garbage /opt/cuda/lib64/libcudart.so.12", wantErr: true},
		{name: "embedded newline", line: "1000-2000 r--p 00000000 08:01 5 /a\n/b", wantErr: true},
		{name: "two trailing newlines", line: "1000-2000 r--p 00000000 08:01 5 /a\n\n", wantErr: true},
		{name: "no dash", line: "1000 2000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "empty start", line: "-2000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "empty end", line: "1000- r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "end below start", line: "2000-1000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "start overflow", line: "17f0000020000000000-7f0000030000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "end overflow", line: "1000-10000000000000000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "non-hex start", line: "10g0-2000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "signed start", line: "+1000-2000 r--p 00000000 08:01 5 /a", wantErr: true},
		{name: "bad perms", line: "1000-2000 rwzp 00000000 08:01 5 /a", wantErr: true},
		{name: "short perms", line: "1000-2000 rw 00000000 08:01 5 /a", wantErr: true},
		{name: "long perms", line: "1000-2000 rw-pp 00000000 08:01 5 /a", wantErr: true},
		{name: "offset overflow", line: "1000-2000 r--p 1ffffffffffffffff 08:01 5 /a", wantErr: true},
		{name: "major overflow", line: "1000-2000 r--p 00000000 100000000:01 5 /a", wantErr: true},
		{name: "minor overflow", line: "1000-2000 r--p 00000000 08:100000000 5 /a", wantErr: true},
		{name: "no colon", line: "1000-2000 r--p 00000000 0801 5 /a", wantErr: true},
		{name: "empty minor", line: "1000-2000 r--p 00000000 08: 5 /a", wantErr: true},
		{name: "inode overflow", line: "1000-2000 r--p 00000000 08:01 18446744073709551616 /a", wantErr: true},
		{name: "hex inode", line: "1000-2000 r--p 00000000 08:01 5f /a", wantErr: true},
		{name: "missing inode", line: "1000-2000 r-xp 00010000 08:01 /opt/cuda/lib64/libcudart.so.12", wantErr: true},
		{name: "missing dev", line: "1000-2000 r-xp 00010000", wantErr: true},
		{name: "missing offset", line: "1000-2000 r-xp", wantErr: true},
		{name: "missing perms", line: "1000-2000", wantErr: true},
		{name: "tab separated", line: "1000-2000\tr--p 00000000 08:01 5 /a", wantErr: true},
		{name: "NUL", line: "1000-2000 r--p\x00 00000000 08:01 5 /a", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := ParseMapsLine(tt.line)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseMapsLine(%q) = %+v, %v, nil; want an error", tt.line, got, ok)
				}
				if !errors.Is(err, ErrMalformedMapsLine) {
					t.Errorf("error %v does not wrap ErrMalformedMapsLine", err)
				}
				if ok || got != (MapsEntry{}) {
					t.Errorf("ParseMapsLine(%q) returned %+v, %v with its error", tt.line, got, ok)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseMapsLine(%q): %v", tt.line, err)
			}
			if ok != tt.ok || got != tt.want {
				t.Errorf("ParseMapsLine(%q)\n got %+v, %v\nwant %+v, %v", tt.line, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestParseMapsLineNoAlloc(t *testing.T) {
	line := []byte("7f3a2c010000-7f3a2c060000 r-xp 00010000 103:02 1839412                   /usr/local/cuda/lib64/libcudart.so.12.4.127\n")
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := parseMaps(line); err != nil {
			t.Fatal(err)
		}
		if _, err := parseMaps(line[:20]); err == nil {
			t.Fatal("short line parsed")
		}
	})
	if allocs != 0 {
		t.Errorf("parseMaps allocates %v times per call", allocs)
	}
}

func TestStatFields(t *testing.T) {
	tests := []struct {
		name      string
		stat      string
		state     byte
		start     uint64
		wantError bool
	}{
		{name: "plain", stat: "100 (python3) S 1 100 100 0 -1 4194560 2710 0 0 0 31 12 0 0 20 0 9 0 123456 3171237888 12345\n", state: 'S', start: 123456},
		{name: "comm with parens and spaces", stat: "500 (worker ) (x) R 1 500 500 0 -1 4194560 2710 0 0 0 31 12 0 0 20 0 9 0 500500 3171237888\n", state: 'R', start: 500500},
		{name: "start time is the last field", stat: "7 (a) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 42\n", state: 'Z', start: 42},
		{name: "no newline", stat: "7 (a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 42", state: 'S', start: 42},
		{name: "too few fields", stat: "7 (a) S 1 2 3\n", wantError: true},
		{name: "no comm", stat: "7 a S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 42", wantError: true},
		{name: "bad start time", stat: "7 (a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -42 0", wantError: true},
		{name: "empty", stat: "", wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, start, err := statFields([]byte(tt.stat))
			if tt.wantError {
				if err == nil {
					t.Errorf("statFields(%q) = %c, %d; want an error", tt.stat, state, start)
				}
				return
			}
			if err != nil || state != tt.state || start != tt.start {
				t.Errorf("statFields(%q) = %q, %d, %v; want %q, %d", tt.stat, state, start, err, tt.state, tt.start)
			}
		})
	}
}

func FuzzParseMapsLine(f *testing.F) {
	for _, s := range []string{
		"7f3a2c010000-7f3a2c060000 r-xp 00010000 103:02 1839412                   /usr/local/cuda/lib64/libcudart.so.12.4.127",
		"55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0                          [heap]",
		"7f3a2c084000-7f3a2c090000 rw-p 00000000 00:00 0 ",
		"7f2000000000-7f2000010000 r--p 00000000 08:01 900  /usr/local/cuda/lib64/libcudart.so.12 (deleted)",
		"7f3000000000-7f3000010000 r--p 00000000 00:2f 42 /opt/my libs/libcudart.so.11.0\n",
		"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
		"7f0000000000-7f0000001000 rw-s 00000000 00:0e 1054  anon_inode:[perf_event]",
		"ffffffffff600000-ffffffffffffffff --xp ffffffffffffffff fff:fffff 18446744073709551615 /x",
		"garbage /opt/cuda/lib64/libcudart.so.12",
		"1000-2000 r-xp 00010000 08:01 /opt/cuda/lib64/libcudart.so.12",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, ok, err := ParseMapsLine(line)
		raw, rawErr := parseMaps([]byte(line))
		if (err == nil) != (rawErr == nil) {
			t.Fatalf("string and []byte parsers disagree on %q: %v vs %v", line, err, rawErr)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformedMapsLine) {
				t.Fatalf("error %v does not wrap ErrMalformedMapsLine", err)
			}
			return
		}
		if !ok {
			return
		}
		if raw.start != e.Start || raw.end != e.End || raw.offset != e.Offset || raw.dev != e.Dev || raw.inode != e.Inode {
			t.Fatalf("string and []byte parsers disagree on %q", line)
		}
		if e.End < e.Start || len(e.Perms) != 4 || !strings.HasPrefix(e.Path, "/") {
			t.Fatalf("ParseMapsLine(%q) = %+v breaks an invariant", line, e)
		}
		major, minor := devParts(e.Dev)
		path := e.Path
		if e.Deleted {
			path += deletedSuffix
		}
		again := fmt.Sprintf("%08x-%08x %s %08x %02x:%02x %d                   %s\n",
			e.Start, e.End, e.Perms, e.Offset, major, minor, e.Inode, path)
		e2, ok2, err2 := ParseMapsLine(again)
		if err2 != nil || !ok2 || e2 != e {
			t.Fatalf("round trip of %q via %q: got %+v, %v, %v; want %+v", line, again, e2, ok2, err2, e)
		}
	})
}

// devParts splits a device number encoded by mkdev, like unix.Major and
// unix.Minor.
func devParts(dev uint64) (major, minor uint32) {
	major = uint32((dev>>8)&0x00000fff) | uint32((dev>>32)&0xfffff000)
	minor = uint32(dev&0x000000ff) | uint32((dev>>12)&0xffffff00)
	return major, minor
}

func TestParseStatCPUTime(t *testing.T) {
	line := "500 (worker ) (x) R 1 500 500 0 -1 4194560 2710 0 0 0 31 12 0 0 20 0 9 0 500500 3171237888\n"
	st, err := parseStat([]byte(line))
	if err != nil || st.utime != 31 || st.stime != 12 || st.start != 500500 || st.state != 'R' {
		t.Errorf("parseStat(%q) = %+v, %v; want utime 31, stime 12, start 500500, state R", line, st, err)
	}
}
