package kmsg

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRing is a kernel log ring as syslog(2) shows it: READ_ALL returns the
// newest whole lines that fit the buffer.
type fakeRing struct {
	mu    sync.Mutex
	lines []string
	size  int
	reads []int // buffer sizes READ_ALL was called with
}

func (f *fakeRing) add(lines ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, lines...)
	for total(f.lines) > f.size { // the ring overwrites its oldest
		f.lines = f.lines[1:]
	}
}

func total(lines []string) int {
	n := 0
	for _, l := range lines {
		n += len(l) + 1
	}
	return n
}

func (f *fakeRing) klogctl(typ int, buf []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch typ {
	case syslogActionSizeBuffer:
		return f.size, nil
	case syslogActionReadAll:
		f.reads = append(f.reads, len(buf))
		i := len(f.lines)
		for i > 0 && total(f.lines[i-1:]) <= len(buf) {
			i--
		}
		return copy(buf, strings.Join(f.lines[i:], "\n")+"\n"), nil
	}
	panic("unexpected syslog action")
}

func readRecords(t *testing.T, s *syslogSource, n int) []Record {
	t.Helper()
	var out []Record
	buf := make([]byte, bufSize)
	for range n {
		k, err := s.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := Parse(buf[:k], DefaultMaxMessage)
		if err != nil {
			t.Fatalf("%q: %v", buf[:k], err)
		}
		out = append(out, rec)
	}
	return out
}

// The syslog(2) source returns only lines written after it opened, each
// once, as /dev/kmsg records: facility and level from the prefix, the
// timestamp, the text escaped as /dev/kmsg escapes it, and a skipped
// sequence number where the ring overwrote lines before a poll saw them.
func TestSyslogSource(t *testing.T) {
	ring := &fakeRing{size: 64 << 10}
	ring.add("<6>[    1.000000] old line", "<4>[    2.500000] older warning")
	s, err := openSyslog(ring.klogctl, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	ring.add("<4>[   10.000001] WARNING: CPU: 0 PID: 1 at kernel/events/uprobes.c:1 x", "<14>[   11.000000] NVRM: Xid (PCI:0000:01:00): 79, forged\\")
	recs := readRecords(t, s, 2)
	if r := recs[0]; r.Facility != FacilityKernel || r.Level != LevelWarning || r.Seq != 1 ||
		r.Time != 10*time.Second+time.Microsecond || r.Message != "WARNING: CPU: 0 PID: 1 at kernel/events/uprobes.c:1 x" {
		t.Errorf("first record %+v", r)
	}
	if r := recs[1]; r.Facility != FacilityUser || r.Level != LevelInfo || r.Seq != 2 || r.Message != `NVRM: Xid (PCI:0000:01:00): 79, forged\x5c` {
		t.Errorf("second record %+v", r)
	}

	// More than the tail read holds, then lines the ring overwrote before
	// the next poll: the whole ring is read, and the gap shows.
	var many []string
	for i := range 1000 {
		many = append(many, "<6>[   20.000000] line "+strings.Repeat("x", 40)+string(rune('a'+i%26)))
	}
	ring.add(many...)
	got := readRecords(t, s, 1000)
	if got[0].Seq != 3 || got[999].Seq != 1002 {
		t.Errorf("sequence numbers %d..%d, want 3..1002", got[0].Seq, got[999].Seq)
	}
	if ring.reads[len(ring.reads)-1] != ring.size {
		t.Errorf("reads %v: the last line was not in the tail, want a read of the whole ring (%d)", ring.reads, ring.size)
	}
	var flood []string
	for range 3000 { // more than the ring holds: the last line read is gone
		flood = append(flood, "<6>[   30.000000] overwrite")
	}
	ring.add(flood...)
	ring.add("<6>[   31.000000] after the gap")
	if r := readRecords(t, s, 1)[0]; r.Seq != 1004 || r.Message != "overwrite" {
		t.Errorf("first record after the overwritten lines: %+v, want sequence number 1004 (one skipped)", r)
	}
	for readRecords(t, s, 1)[0].Message != "after the gap" {
	}

	// Close ends a pending Read.
	done := make(chan error, 1)
	go func() { _, err := s.Read(make([]byte, bufSize)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Read after Close returned a record")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a pending Read")
	}
}
