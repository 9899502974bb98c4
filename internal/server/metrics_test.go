package server

import (
	"compress/gzip"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsCompressionAndFilter: gzip only when the scraper accepts it,
// the same body either way, and name[] selects families as promhttp's
// handler does.
func TestMetricsCompressionAndFilter(t *testing.T) {
	t.Parallel()
	reg := testGatherer(t)
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "profi_test_other", Help: "Other gauge."})
	other.Set(2)
	reg.MustRegister(other)
	s := listen(t, Options{Gatherer: reg})
	defer s.ln.Close()
	h := s.Handler()

	const both = "# HELP profi_test_events_total Test counter.\n# TYPE profi_test_events_total counter\nprofi_test_events_total 3\n" +
		"# HELP profi_test_other Other gauge.\n# TYPE profi_test_other gauge\nprofi_test_other 2\n"
	for _, tc := range []struct {
		acceptEncoding string
		gzipped        bool
	}{
		{"", false},
		{"gzip", true},
		{"deflate, gzip;q=0.5", true},
		{"*", true},
		{"gzip;q=0, identity", false},
		{"GZIP; Q=0.0", false},
		{"br", false},
	} {
		header := http.Header{}
		if tc.acceptEncoding != "" {
			header.Set("Accept-Encoding", tc.acceptEncoding)
		}
		code, got, body := get(t, h, http.MethodGet, "/metrics", header)
		if code != http.StatusOK {
			t.Fatalf("Accept-Encoding %q: HTTP %d", tc.acceptEncoding, code)
		}
		if enc := got.Get("Content-Encoding"); (enc == "gzip") != tc.gzipped {
			t.Errorf("Accept-Encoding %q: Content-Encoding %q, want gzip %v", tc.acceptEncoding, enc, tc.gzipped)
		}
		if tc.gzipped {
			zr, err := gzip.NewReader(strings.NewReader(body))
			if err != nil {
				t.Fatalf("Accept-Encoding %q: %v", tc.acceptEncoding, err)
			}
			b, err := io.ReadAll(zr)
			if err != nil {
				t.Fatalf("Accept-Encoding %q: %v", tc.acceptEncoding, err)
			}
			body = string(b)
		}
		if body != both {
			t.Errorf("Accept-Encoding %q: body %q, want %q", tc.acceptEncoding, body, both)
		}
		if vary := got.Values("Vary"); !slices.Equal(vary, []string{"Accept", "Accept-Encoding"}) {
			t.Errorf("Vary = %q", vary)
		}
	}

	_, _, body := get(t, h, http.MethodGet, "/metrics?name[]=profi_test_other&name[]=profi_nope", nil)
	if want := "# HELP profi_test_other Other gauge.\n# TYPE profi_test_other gauge\nprofi_test_other 2\n"; body != want {
		t.Errorf("name[] filter: %q, want %q", body, want)
	}
}
