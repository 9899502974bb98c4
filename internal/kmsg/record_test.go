package kmsg

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Records as kernels write them: a WARN on x86-64, an arm64 call trace
// line, an NVIDIA Xid, a device record with its continuation lines, a
// line userspace wrote, the 'c' flag of older kernels, a header with a
// field past the flag.
var realRecords = []string{
	"4,1234,5678901,-;WARNING: CPU: 3 PID: 4711 at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0\n",
	"4,1240,5679002,-; uprobe_single_step_handler+0x38/0x60\n",
	"4,1250,7000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
	"6,339,5140900,-;NET: Registered protocol family 10\n",
	"3,777,12345678,-;usb 1-1: device descriptor read/64, error -71\n SUBSYSTEM=usb\n DEVICE=c189:1\n",
	"12,800,13000000,-;profi-test: hello\\x0a world\n",
	"4,900,14000000,c;partial line\n",
	"6,901,14000001,-,caller=T42;with a caller field\n",
}

func TestParse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   string
		max  int
		want Record
		err  bool
	}{
		{name: "warning", in: realRecords[0], want: Record{Facility: 0, Level: 4, Seq: 1234, Time: 5678901 * time.Microsecond, Flag: '-',
			Message: "WARNING: CPU: 3 PID: 4711 at kernel/events/uprobes.c:2163 handle_swbp+0x3c4/0x4d0"}},
		{name: "dict", in: realRecords[4], want: Record{Level: 3, Seq: 777, Time: 12345678 * time.Microsecond, Flag: '-',
			Message: "usb 1-1: device descriptor read/64, error -71", Dict: []string{"SUBSYSTEM=usb", "DEVICE=c189:1"}}},
		{name: "user facility", in: realRecords[5], want: Record{Facility: 1, Level: 4, Seq: 800, Time: 13 * time.Second, Flag: '-',
			Message: `profi-test: hello\x0a world`}},
		{name: "continued", in: realRecords[6], want: Record{Level: 4, Seq: 900, Time: 14 * time.Second, Flag: 'c', Message: "partial line"}},
		{name: "extra header field", in: realRecords[7], want: Record{Level: 6, Seq: 901, Time: 14*time.Second + time.Microsecond, Flag: '-', Message: "with a caller field"}},
		{name: "no flag", in: "6,1,2;old\n", want: Record{Level: 6, Seq: 1, Time: 2 * time.Microsecond, Flag: '-', Message: "old"}},
		{name: "no newline", in: "6,1,2,-;x", want: Record{Level: 6, Seq: 1, Time: 2 * time.Microsecond, Flag: '-', Message: "x"}},
		{name: "truncated", in: "6,1,2,-;" + strings.Repeat("a", 20) + "\n", max: 8,
			want: Record{Level: 6, Seq: 1, Time: 2 * time.Microsecond, Flag: '-', Message: "aaaaaaaa", Truncated: true}},
		{name: "semicolon in message", in: "6,1,2,-;a;b\n", want: Record{Level: 6, Seq: 1, Time: 2 * time.Microsecond, Flag: '-', Message: "a;b"}},
		{name: "non-continuation line skipped", in: "6,1,2,-;a\nB=1\n C=2\n", want: Record{Level: 6, Seq: 1, Time: 2 * time.Microsecond, Flag: '-', Message: "a", Dict: []string{"C=2"}}},
		{name: "no semicolon", in: "6,1,2,-\n", err: true},
		{name: "two fields", in: "6,1;x\n", err: true},
		{name: "bad priority", in: "x,1,2,-;m\n", err: true},
		{name: "negative sequence", in: "6,-1,2,-;m\n", err: true},
		{name: "timestamp overflow", in: "6,1,99999999999999999999,-;m\n", err: true},
		{name: "timestamp too large for a duration", in: "6,1,9223372036854776,-;m\n", err: true},
		{name: "empty", in: "", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse([]byte(tc.in), tc.max)
			if tc.err {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Parse(%q) = %+v, %v; want ErrMalformed", tc.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse(%q) =\n%+v, want\n%+v", tc.in, got, tc.want)
			}
		})
	}
}

// TestParseBoundsDict: a record cannot make the parser keep more than
// maxDict continuation lines of maxDictLine bytes.
func TestParseBoundsDict(t *testing.T) {
	t.Parallel()
	in := "6,1,2,-;m\n" + strings.Repeat(" K="+strings.Repeat("v", 1000)+"\n", 100)
	r, err := Parse([]byte(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Dict) != maxDict {
		t.Fatalf("%d dict lines, want %d", len(r.Dict), maxDict)
	}
	for _, d := range r.Dict {
		if len(d) != maxDictLine {
			t.Fatalf("dict line of %d bytes, want %d", len(d), maxDictLine)
		}
	}
}

// FuzzParse: any bytes parse or fail with ErrMalformed, never panic; a
// parsed record stays within its bounds, holds no newline, and formats
// back to bytes that parse to the same record.
func FuzzParse(f *testing.F) {
	for _, r := range realRecords {
		f.Add([]byte(r))
	}
	f.Add([]byte("6,1,2;"))
	f.Add([]byte(";"))
	f.Fuzz(func(t *testing.T, b []byte) {
		const max = 64
		r, err := Parse(b, max)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if len(r.Message) > max || strings.ContainsRune(r.Message, '\n') || len(r.Dict) > maxDict || r.Level > 7 {
			t.Fatalf("record out of bounds: %+v", r)
		}
		for _, d := range r.Dict {
			if len(d) > maxDictLine || strings.ContainsRune(d, '\n') {
				t.Fatalf("dict line out of bounds: %q", d)
			}
		}
		again, err := Parse(r.Format(), max)
		if err != nil {
			t.Fatalf("Format of %+v does not parse: %v", r, err)
		}
		again.Truncated = r.Truncated
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip:\n%+v\n%+v", r, again)
		}
	})
}
