package collector

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/profi-dev/profi/internal/aggregate"
)

// Exposition is everything the agent exports: the families a registry
// gathers (node-level and self families) and the collector's per-process
// families, which bypass the registry (series.go). /metrics encodes it
// and OTLP gathers it, so both export the same data.
type Exposition struct {
	registry prometheus.Gatherer
	c        *Collector
	// mu serialises the registry gathers, each with its snapshot pinned
	// in c (scrapes and OTLP pushes can overlap).
	mu sync.Mutex
}

// NewExposition joins the registry (with c registered) and c's
// per-process families.
func NewExposition(registry prometheus.Gatherer, c *Collector) *Exposition {
	return &Exposition{registry: registry, c: c}
}

// gatherRegistry gathers the registry with one snapshot pinned in the
// collector and returns that snapshot: every family of a scrape comes
// from the same drain (a drain between the two would pair new counts
// with old histograms).
func (e *Exposition) gatherRegistry() ([]*dto.MetricFamily, *aggregate.Snapshot, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.c.data.Snapshot()
	e.c.pinned.Store(s)
	defer e.c.pinned.Store(nil)
	mfs, err := e.registry.Gather()
	return mfs, s, err
}

// Gather returns every family, sorted by name. A registry error comes
// with the families it could gather.
func (e *Exposition) Gather() ([]*dto.MetricFamily, error) {
	mfs, s, err := e.gatherRegistry()
	mfs = append(mfs, e.c.gatherFamilies(s)...)
	slices.SortFunc(mfs, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return mfs, err
}

// Encode writes every family in format f to w; keep, when non-nil,
// selects families by name. The text format and OpenMetrics 1.0 get the
// per-process families written directly, after the registry's; other
// formats (protobuf, OpenMetrics 2.0) encode Gather's families. A
// registry error is returned after everything else was written.
func (e *Exposition) Encode(w io.Writer, f expfmt.Format, keep func(string) bool) error {
	direct := f.FormatType() == expfmt.TypeTextPlain ||
		f.FormatType() == expfmt.TypeOpenMetrics && (f.Version() == expfmt.OpenMetricsVersion_1_0_0 || f.Version() == expfmt.OpenMetricsVersion_0_0_1)
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := expfmt.NewEncoder(bw, f)
	var (
		mfs       []*dto.MetricFamily
		snap      *aggregate.Snapshot
		gatherErr error
	)
	if direct {
		mfs, snap, gatherErr = e.gatherRegistry()
	} else {
		mfs, gatherErr = e.Gather()
	}
	errs := []error{encodeEach(enc, mfs, keep)}
	if direct {
		e.c.writeFamilies(bw, snap, f.FormatType() == expfmt.TypeOpenMetrics, keep)
	}
	if c, ok := enc.(io.Closer); ok { // OpenMetrics' final # EOF
		errs = append(errs, c.Close())
	}
	errs = append(errs, bw.Flush())
	if gatherErr != nil {
		errs = append(errs, fmt.Errorf("gather: %w", gatherErr))
	}
	return errors.Join(errs...)
}

// EncodeFamilies writes mfs in format f to w, as promhttp does; keep,
// when non-nil, selects families by name.
func EncodeFamilies(w io.Writer, f expfmt.Format, mfs []*dto.MetricFamily, keep func(string) bool) error {
	enc := expfmt.NewEncoder(w, f)
	err := encodeEach(enc, mfs, keep)
	if c, ok := enc.(io.Closer); ok { // OpenMetrics' final # EOF
		err = errors.Join(err, c.Close())
	}
	return err
}

// encodeEach encodes the families keep selects; a family that fails does
// not stop the others.
func encodeEach(enc expfmt.Encoder, mfs []*dto.MetricFamily, keep func(string) bool) error {
	var errs []error
	for _, mf := range mfs {
		if keep != nil && !keep(mf.GetName()) {
			continue
		}
		if err := enc.Encode(mf); err != nil {
			errs = append(errs, fmt.Errorf("encode %s: %w", mf.GetName(), err))
		}
	}
	return errors.Join(errs...)
}
