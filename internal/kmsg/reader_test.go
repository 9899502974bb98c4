package kmsg

import (
	"context"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// script is a fake kernel log: each Read returns the next record or error,
// then io.EOF (which ends the reader's loop with an error).
type script struct {
	steps []any // string: a record; error: a read error
}

func (s *script) Read(b []byte) (int, error) {
	if len(s.steps) == 0 {
		return 0, io.EOF
	}
	step := s.steps[0]
	s.steps = s.steps[1:]
	switch v := step.(type) {
	case string:
		if len(v) > len(b) {
			return 0, syscall.EINVAL
		}
		return copy(b, v), nil
	case error:
		return 0, v
	}
	panic("bad step")
}

func (s *script) Close() error { return nil }

func rec(seq int, msg string) string { return fmt.Sprintf("4,%d,%d,-;%s\n", seq, seq*10, msg) }

// TestReaderCounts: every record is delivered in order or counted, by
// reason; sequence gaps after EPIPE count what the kernel overwrote.
func TestReaderCounts(t *testing.T) {
	t.Parallel()
	src := &script{steps: []any{
		rec(10, "a"),
		rec(11, "b"),
		syscall.EPIPE, // 12..14 overwritten
		rec(15, "c"),
		"garbage without a header",
		syscall.EINVAL, // a record longer than the buffer
		rec(16, strings.Repeat("x", 40)),
		rec(20, "d"), // 17..19 gone without an EPIPE
		rec(21, "e"), // over the rate: burst 5 used by a b c x d
	}}
	r := New(Options{Path: "fake", MaxMessage: 32, Rate: 1e-9, Burst: 5,
		Open: func(string) (io.ReadCloser, error) { return src, nil }})
	var got []string
	r.Subscribe(func(rc Record) { got = append(got, fmt.Sprintf("%d:%s:%v", rc.Seq, rc.Message, rc.Truncated)) })
	err := r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("Run = %v, want the script's EOF", err)
	}
	want := []string{"10:a:false", "11:b:false", "15:c:false", "16:" + strings.Repeat("x", 32) + ":true", "20:d:false"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("delivered %q, want %q", got, want)
	}
	st := r.Stats()
	wantDrops := map[string]uint64{DropOverwritten: 6, DropTooLong: 1, DropMalformed: 1, DropRate: 1}
	if st.Records != 5 || st.Truncated != 1 || !reflect.DeepEqual(st.Drops, wantDrops) || st.Running || st.Error == "" {
		t.Errorf("stats %+v, want 5 records, 1 truncated, drops %v, stopped with the error", st, wantDrops)
	}
	exp := `
# HELP profi_system_kmsg_drops_total Kernel log records not handed to profi's consumers, by reason: overwritten (the kernel's ring overwrote them before they were read), too_long, rate (over the rate bound), malformed.
# TYPE profi_system_kmsg_drops_total counter
profi_system_kmsg_drops_total{reason="malformed"} 1
profi_system_kmsg_drops_total{reason="overwritten"} 6
profi_system_kmsg_drops_total{reason="rate"} 1
profi_system_kmsg_drops_total{reason="too_long"} 1
# HELP profi_system_kmsg_records_total Kernel log records read from /dev/kmsg since the agent started (records written before it started are not read).
# TYPE profi_system_kmsg_records_total counter
profi_system_kmsg_records_total 5
`
	if err := testutil.CollectAndCompare(r, strings.NewReader(exp), "profi_system_kmsg_drops_total", "profi_system_kmsg_records_total"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.CollectAndLint(prometheus.Collector(r)); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestReaderEPIPEFirst: an overwrite before any record counts one.
func TestReaderEPIPEFirst(t *testing.T) {
	t.Parallel()
	src := &script{steps: []any{syscall.EPIPE, rec(5, "a")}}
	r := New(Options{Open: func(string) (io.ReadCloser, error) { return src, nil }})
	_ = r.Run(context.Background())
	if st := r.Stats(); st.Records != 1 || st.Drops[DropOverwritten] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestReaderShortBufferRun: a kernel that returned EINVAL forever would
// make the reader spin; it gives up with an error instead.
func TestReaderShortBufferRun(t *testing.T) {
	t.Parallel()
	steps := make([]any, maxShort+5)
	for i := range steps {
		steps[i] = syscall.EINVAL
	}
	r := New(Options{Open: func(string) (io.ReadCloser, error) { return &script{steps: steps}, nil }})
	err := r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "in a row") {
		t.Fatalf("Run = %v", err)
	}
	if st := r.Stats(); st.Drops[DropTooLong] != maxShort {
		t.Errorf("too_long %d, want %d", st.Drops[DropTooLong], maxShort)
	}
}

// TestReaderOpenFails: the error is returned and kept for /status.
func TestReaderOpenFails(t *testing.T) {
	t.Parallel()
	r := New(Options{Path: "/nonexistent/kmsg"})
	if err := r.Run(context.Background()); err == nil {
		t.Fatal("no error")
	}
	if st := r.Stats(); st.Running || !strings.Contains(st.Error, "/nonexistent/kmsg") {
		t.Errorf("stats %+v", st)
	}
}

// TestReaderDevKmsg follows the real kernel log: a line written before the
// reader opened it is never delivered, a line written after is, with the
// user facility the kernel gives every write; cancelling ends Run.
func TestReaderDevKmsg(t *testing.T) {
	w, err := os.OpenFile(DefaultPath, os.O_WRONLY, 0)
	if err != nil {
		if os.Getenv("PROFI_E2E") == "1" {
			t.Fatalf("open %s for writing: %v", DefaultPath, err)
		}
		t.Skipf("open %s for writing: %v", DefaultPath, err)
	}
	defer w.Close()
	token := fmt.Sprintf("profi-kmsg-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	if _, err := fmt.Fprintf(w, "<4>%s before\n", token); err != nil {
		t.Fatal(err)
	}
	r := New(Options{})
	var mu sync.Mutex
	var got []Record
	seen := make(chan struct{}, 1)
	r.Subscribe(func(rc Record) {
		if !strings.HasPrefix(rc.Message, token) {
			return // other programs' lines
		}
		mu.Lock()
		got = append(got, rc)
		mu.Unlock()
		if strings.HasSuffix(rc.Message, "after") {
			seen <- struct{}{}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !r.Stats().Running {
		if time.Now().After(deadline) {
			t.Fatalf("reader not running: %+v", r.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := fmt.Fprintf(w, "<4>%s after\n", token); err != nil {
		t.Fatal(err)
	}
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the line written after start never arrived")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Message != token+" after" || got[0].Facility != FacilityUser || got[0].Level != LevelWarning {
		t.Errorf("got %+v, want only the line written after start, facility user, level warning", got)
	}
}
