package xid

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		msg  string
		want Line
		err  error
	}{
		{"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
			Line{Bus: BusID{0, 0x3b, 0}, Code: 79, PID: 1234, Name: "python3", Detail: "GPU has fallen off the bus."}, nil},
		{"NVRM: Xid (PCI:0000:86:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
			Line{Bus: BusID{0, 0x86, 0}, Code: 13, Detail: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"}, nil},
		{"NVRM: Xid (PCI:0001:af:00): 31, pid='<unknown>', name=<unknown>, Ch 00000010, intr 10000000. MMU Fault",
			Line{Bus: BusID{1, 0xaf, 0}, Code: 31, Name: "<unknown>", Detail: "Ch 00000010, intr 10000000. MMU Fault"}, nil},
		{"NVRM: Xid (PCI:0000:3b:00): 119",
			Line{Bus: BusID{0, 0x3b, 0}, Code: 119}, nil},
		{"NVRM: GPU at PCI:0000:3b:00: GPU-…", Line{}, ErrNotXid},
		{"usb 1-1: new device", Line{}, ErrNotXid},
		{"NVRM: Xid (PCI:0000:3b): 79, x", Line{}, ErrMalformed},
		{"NVRM: Xid (PCI:0000:3b:00): 7999, x", Line{}, ErrMalformed},
		{"NVRM: Xid (PCI:0000:3b:00): x79", Line{}, ErrMalformed},
		{"NVRM: Xid (PCI:0000:3b:00): 79, pid=12ab, name=x, y", Line{}, ErrMalformed},
		{"NVRM: Xid (PCI:zzzz:3b:00): 79, y", Line{}, ErrMalformed},
		{"NVRM: Xid (PCI:0000:3b:40): 79, y", Line{}, ErrMalformed}, // device > 31
	} {
		got, err := Parse(tc.msg)
		if !errors.Is(err, tc.err) || (err == nil && got != tc.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", tc.msg, got, err, tc.want, tc.err)
		}
	}
}

func TestParseBusIDNVMLForm(t *testing.T) {
	t.Parallel()
	a, err1 := ParseBusID("00000000:3B:00.0")
	b, err2 := ParseBusID("0000:3b:00")
	if err1 != nil || err2 != nil || a != b || a.String() != "00000000:3B:00.0" {
		t.Fatalf("%v %v %v %v", a, err1, b, err2)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
		"NVRM: Xid (PCI:0001:af:00): 31, pid='<unknown>', name=<unknown>, Ch 00000010",
		"NVRM: Xid (PCI:0000:3b:00): 119",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse(s)
		if err == nil && (len(l.Detail) > maxDetail || len(l.Name) > 64 || l.Code > 999) {
			t.Fatalf("unbounded: %+v", l)
		}
	})
}
