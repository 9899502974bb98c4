package server

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/profi-dev/profi/internal/collector"
)

// Metrics is what /metrics serves.
type Metrics interface {
	// Encode writes every family in format f to w; keep, when non-nil,
	// selects families by name. An error is logged after the response.
	Encode(w io.Writer, f expfmt.Format, keep func(name string) bool) error
}

// gathererMetrics serves a Gatherer's families.
type gathererMetrics struct{ g prometheus.Gatherer }

func (m gathererMetrics) Encode(w io.Writer, f expfmt.Format, keep func(string) bool) error {
	if m.g == nil {
		return nil
	}
	mfs, err := m.g.Gather()
	return errors.Join(collector.EncodeFamilies(w, f, mfs, keep), err)
}

// gzipWriters are reused across scrapes: a writer holds its window and
// tables, too much to allocate per scrape.
var gzipWriters = sync.Pool{New: func() any {
	// BestSpeed: a large exposition compresses in a fraction of the
	// default level's time, for a slightly larger body.
	w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return w
}}

// metricsHandler serves m as promhttp does: the format negotiated from
// Accept (OpenMetrics included), gzip when accepted, and the name[]
// query parameter selecting families.
func (s *Server) metricsHandler(m Metrics) http.Handler {
	formats := expfmt.DefaultOpenMetricsAcceptedFormats()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		f := expfmt.NegotiateAccept(r.Header, formats...)
		h := w.Header()
		h.Add("Vary", "Accept")
		h.Add("Vary", "Accept-Encoding")
		h.Set("Content-Type", string(f))
		var keep func(string) bool
		if names := r.URL.Query()["name[]"]; len(names) > 0 {
			set := map[string]bool{}
			for _, n := range names {
				set[n] = true
			}
			keep = func(name string) bool { return set[name] }
		}
		var err error
		if acceptsGzip(r.Header.Values("Accept-Encoding")) {
			h.Set("Content-Encoding", "gzip")
			err = encodeGzip(w, m, f, keep)
		} else {
			err = m.Encode(w, f, keep)
		}
		if err != nil {
			s.log.Warn("serve /metrics", "err", err)
		}
		if s.opts.Encode != nil {
			s.opts.Encode(time.Since(began))
		}
	})
}

// encodeGzip writes m's exposition gzipped to w. The compression runs on
// a goroutine of its own, overlapping the encoding: at 5·10⁴ series each
// takes about as long as the other.
func encodeGzip(w io.Writer, m Metrics, f expfmt.Format, keep func(string) bool) error {
	gz := gzipWriters.Get().(*gzip.Writer)
	gz.Reset(w)
	defer func() {
		gz.Reset(nil)
		gzipWriters.Put(gz)
	}()
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		// A buffer as large as the encoder's writes: one read takes a
		// whole write, so the encoder goes on while this one compresses.
		_, err := io.CopyBuffer(gz, pr, make([]byte, 64<<10))
		pr.CloseWithError(err) // a failed client unblocks the encoder
		copied <- err
	}()
	err := m.Encode(pw, f, keep)
	pw.CloseWithError(err)
	if copyErr := <-copied; err == nil {
		err = copyErr
	}
	if closeErr := gz.Close(); err == nil {
		err = closeErr
	}
	return err
}

// acceptsGzip reports whether Accept-Encoding lists gzip (or *) with a
// non-zero quality.
func acceptsGzip(values []string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(part, ";")
			coding = strings.ToLower(strings.TrimSpace(coding))
			if coding != "gzip" && coding != "*" {
				continue
			}
			q := 1.0
			for p := range strings.SplitSeq(params, ";") {
				if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
						q = f
					}
				}
			}
			if q > 0 {
				return true
			}
		}
	}
	return false
}
