package collector

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/testutil/promtest"
)

// encodeFormats are the formats /metrics negotiates; the first four take
// the direct path for the per-process families.
var encodeFormats = []expfmt.Format{
	expfmt.NewFormat(expfmt.TypeTextPlain),
	expfmt.FmtText + "; escaping=underscores",
	expfmt.FmtOpenMetrics_1_0_0,
	expfmt.FmtOpenMetrics_0_0_1,
	expfmt.FmtOpenMetrics_2_0_0,
	expfmt.NewFormat(expfmt.TypeProtoDelim),
	expfmt.NewFormat(expfmt.TypeProtoText),
}

// reference encodes mfs with expfmt, as promhttp would from a registry.
func reference(t *testing.T, g prometheus.Gatherer, f expfmt.Format, keep func(string) bool) []byte {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, f)
	for _, mf := range mfs {
		if keep == nil || keep(mf.GetName()) {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	if c, ok := enc.(io.Closer); ok {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// normalize orders a text or OpenMetrics exposition's families by their
// first line and each family's samples: Encode writes the per-process
// families after the registry's, their series in map order.
func normalize(b []byte) string {
	var blocks [][]string
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if strings.HasPrefix(l, "# HELP ") || len(blocks) == 0 || l == "# EOF\n" {
			blocks = append(blocks, nil)
		}
		blocks[len(blocks)-1] = append(blocks[len(blocks)-1], l)
	}
	var out []string
	for _, bl := range blocks {
		i := 0
		for i < len(bl) && strings.HasPrefix(bl[i], "#") {
			i++
		}
		slices.Sort(bl[i:])
		out = append(out, strings.Join(bl, ""))
	}
	// # EOF must stay last.
	eof := len(out) > 0 && out[len(out)-1] == "# EOF\n"
	if eof {
		out = out[:len(out)-1]
	}
	slices.Sort(out)
	if eof {
		out = append(out, "# EOF\n")
	}
	return strings.Join(out, "")
}

// TestEncodeMatchesExpfmt: whatever the format, /metrics says what
// expfmt says of the same families; the directly written per-process
// families are byte for byte what the registry path would write.
func TestEncodeMatchesExpfmt(t *testing.T) {
	t.Parallel()
	c := newCollector(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	exp := NewExposition(reg, c)
	for _, f := range encodeFormats {
		// The uptime is left out: its value depends on the clock.
		for _, keep := range []func(string) bool{
			func(name string) bool { return name != uptimeFamily },
			func(name string) bool { return name == "profi_cuda_calls_total" || name == "profi_tracked_pids" },
		} {
			t.Run(fmt.Sprintf("%s/%p", f, keep), func(t *testing.T) {
				var got bytes.Buffer
				if err := exp.Encode(&got, f, keep); err != nil {
					t.Fatal(err)
				}
				want := reference(t, exp, f, keep)
				if f.FormatType() == expfmt.TypeProtoDelim || f.FormatType() == expfmt.TypeProtoText {
					if !bytes.Equal(got.Bytes(), want) {
						t.Errorf("Encode differs from expfmt (%d vs %d bytes)", got.Len(), len(want))
					}
					return
				}
				if g, w := normalize(got.Bytes()), normalize(want); g != w {
					t.Errorf("Encode differs from expfmt:\n%s", lineDiff(w, g))
				}
				if !strings.Contains(got.String(), "cudaGraphInstantiate") { // only in a calls series
					t.Error("no profi_cuda_calls_total series")
				}
			})
		}
	}
}

// TestPromtoolDirect checks the direct writer's text with promtool.
func TestPromtoolDirect(t *testing.T) {
	t.Parallel()
	c := newCollector(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	var buf bytes.Buffer
	if err := NewExposition(reg, c).Encode(&buf, expfmt.NewFormat(expfmt.TypeTextPlain), nil); err != nil {
		t.Fatal(err)
	}
	promtest.CheckPromtool(t, buf.Bytes())
}

// TestSeriesFollowLabels: a process whose labels change (its pod arrives)
// is exported with the new labels only; label values that are not UTF-8
// are replaced, never dropped.
func TestSeriesFollowLabels(t *testing.T) {
	t.Parallel()
	p := &aggregate.Process{
		Meta:  aggregate.Meta{PID: 9, Comm: "bad\xffcomm"},
		Calls: map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 5},
	}
	s := &aggregate.Snapshot{Processes: []*aggregate.Process{p}}
	c := New(Data{Snapshot: func() *aggregate.Snapshot { return s }, Attach: func() attach.Counters { return attach.Counters{} }})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	exp := NewExposition(reg, c)
	calls := func(f expfmt.Format) []string {
		var buf bytes.Buffer
		if err := exp.Encode(&buf, f, func(n string) bool { return n == "profi_cuda_calls_total" }); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.HasPrefix(l, "profi_cuda_calls_total{") {
				out = append(out, l)
			}
		}
		return out
	}
	text := expfmt.NewFormat(expfmt.TypeTextPlain)
	want := `profi_cuda_calls_total{comm="bad` + "\uFFFD" + `comm",container="",gpu="",gpu_uuid="",namespace="",operation="cudaFree",pid="9",pod="",stream="default"} 5`
	if got := calls(text); !slices.Equal(got, []string{want}) {
		t.Fatalf("first scrape: %q, want %q", got, want)
	}
	if _, err := (prometheus.Gatherers{exp}).Gather(); err != nil {
		t.Errorf("dto path with a non-UTF-8 comm: %v", err)
	}

	p2 := &aggregate.Process{
		Meta:  aggregate.Meta{PID: 9, Comm: "ok", Namespace: "ml", Pod: "w-0", Container: "main"},
		Calls: map[aggregate.OpStream]uint64{{Op: "cudaFree", Stream: "default"}: 6},
	}
	s = &aggregate.Snapshot{Processes: []*aggregate.Process{p2}}
	want = `profi_cuda_calls_total{comm="ok",container="main",gpu="",gpu_uuid="",namespace="ml",operation="cudaFree",pid="9",pod="w-0",stream="default"} 6`
	if got := calls(text); !slices.Equal(got, []string{want}) {
		t.Fatalf("after the pod arrived: %q, want %q", got, want)
	}
	if got := calls(expfmt.FmtOpenMetrics_1_0_0); !slices.Equal(got, []string{strings.TrimSuffix(want, "6") + "6.0"}) {
		t.Errorf("OpenMetrics: %q", got)
	}
}

// BenchmarkExposition measures one scrape at 5·10⁴ call series (the 50k
// level of bench/scale_test.go), steady state: the direct text path that
// Prometheus gets, and the dto path of protobuf scrapes and OTLP.
func BenchmarkExposition(b *testing.B) {
	const procs, series = 4, 50_000
	s := &aggregate.Snapshot{Series: series}
	for p := range procs {
		proc := &aggregate.Process{Meta: aggregate.Meta{PID: 1000 + p, Comm: "scale"}, Calls: map[aggregate.OpStream]uint64{}}
		for i := range series / procs {
			proc.Calls[aggregate.OpStream{Op: "cuLaunchKernel", Stream: fmt.Sprintf("0x%x", 0x5ca1e0000+i*16)}] = uint64(i)
		}
		s.Processes = append(s.Processes, proc)
	}
	c := New(Data{Snapshot: func() *aggregate.Snapshot { return s }, Attach: func() attach.Counters { return attach.Counters{} }})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	exp := NewExposition(reg, c)
	for name, f := range map[string]expfmt.Format{
		"text":        expfmt.NewFormat(expfmt.TypeTextPlain),
		"openmetrics": expfmt.FmtOpenMetrics_1_0_0,
		"protobuf":    expfmt.NewFormat(expfmt.TypeProtoDelim),
	} {
		b.Run(name, func(b *testing.B) {
			scrape := func() {
				if err := exp.Encode(io.Discard, f, nil); err != nil {
					b.Fatal(err)
				}
			}
			scrape() // the first scrape of a series builds its text
			b.ReportAllocs()
			for b.Loop() {
				scrape()
			}
		})
	}
}

// TestOneSnapshotPerScrape: a scrape's families all come from one
// snapshot, even when a drain publishes a new one in the middle of it:
// here every read of the latest snapshot finds a newer one, whose calls
// and latency count are both its sequence number.
func TestOneSnapshotPerScrape(t *testing.T) {
	t.Parallel()
	var seq atomic.Uint64
	next := func() *aggregate.Snapshot {
		n := seq.Add(1)
		return &aggregate.Snapshot{
			Processes: []*aggregate.Process{{
				Meta:  aggregate.Meta{PID: 7, Comm: "w"},
				Calls: map[aggregate.OpStream]uint64{{Op: "cudaMemcpy", Stream: "default"}: n},
			}},
			Hists: map[aggregate.HistKey]*aggregate.Hist{{Op: "cudaMemcpy"}: {Count: n}},
		}
	}
	c := New(Data{Snapshot: next, Attach: func() attach.Counters { return attach.Counters{} }})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	exp := NewExposition(reg, c)
	same := func(mfs map[string]*dto.MetricFamily) {
		t.Helper()
		calls := mfs["profi_cuda_calls_total"].GetMetric()[0].GetCounter().GetValue()
		count := mfs["profi_cuda_duration_count_total"].GetMetric()[0].GetCounter().GetValue()
		if calls != count {
			t.Errorf("calls %v and latency count %v come from different snapshots", calls, count)
		}
	}
	for _, f := range []expfmt.Format{expfmt.NewFormat(expfmt.TypeTextPlain), expfmt.NewFormat(expfmt.TypeProtoDelim)} {
		var buf bytes.Buffer
		if err := exp.Encode(&buf, f, nil); err != nil {
			t.Fatal(err)
		}
		mfs := map[string]*dto.MetricFamily{}
		dec := expfmt.NewDecoder(&buf, f)
		for {
			var mf dto.MetricFamily
			if err := dec.Decode(&mf); err != nil {
				if err != io.EOF {
					t.Fatalf("%s: %v", f, err)
				}
				break
			}
			mfs[mf.GetName()] = &mf
		}
		same(mfs)
	}
	gathered, err := exp.Gather()
	if err != nil {
		t.Fatal(err)
	}
	mfs := map[string]*dto.MetricFamily{}
	for _, mf := range gathered {
		mfs[mf.GetName()] = mf
	}
	same(mfs)
}
