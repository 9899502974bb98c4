// Package otlptest is an in-process OTLP metrics receiver (gRPC and
// HTTP/protobuf, the real go.opentelemetry.io/proto/otlp service) for
// tests, with helpers that turn what it received back into Prometheus
// families and generate TLS material.
package otlptest

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MetricsPath is the OTLP/HTTP metrics path.
const MetricsPath = "/v1/metrics"

// Request is one export the receiver accepted.
type Request struct {
	Body *colmetricpb.ExportMetricsServiceRequest
	// Header holds the HTTP headers or the gRPC metadata (use Get).
	Header http.Header
	// Path is the HTTP request path ("" for gRPC).
	Path string
	// ClientCN is the common name of the verified client certificate, if any.
	ClientCN string
	Received time.Time
}

// Receiver records every export. Reject makes it refuse exports
// (gRPC Unavailable, HTTP 503), as a collector that is overloaded; Hold
// makes it answer nothing until the client gives up (a hung collector).
type Receiver struct {
	// Addr is host:port; URL is the base URL (http:// or https://).
	Addr, URL string
	Reject    atomic.Bool
	Hold      atomic.Bool

	mu      sync.Mutex
	reqs    []Request
	changed chan struct{} // closed and replaced on every request
	calls   atomic.Int64  // every export attempt, accepted or not
}

func newReceiver(addr, scheme string) *Receiver {
	return &Receiver{Addr: addr, URL: scheme + "://" + addr, changed: make(chan struct{})}
}

func (r *Receiver) record(req Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Calls is the number of export attempts seen, refused ones included.
func (r *Receiver) Calls() int64 { return r.calls.Load() }

// Len is the number of accepted exports.
func (r *Receiver) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// Requests returns the accepted exports so far.
func (r *Receiver) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.reqs...)
}

// Wait returns the n-th accepted export (1-based), waiting for it until
// ctx ends.
func (r *Receiver) Wait(ctx context.Context, n int) (Request, error) {
	for {
		r.mu.Lock()
		if len(r.reqs) >= n {
			req := r.reqs[n-1]
			r.mu.Unlock()
			return req, nil
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return Request{}, fmt.Errorf("waiting for export %d (have %d): %w", n, r.Len(), ctx.Err())
		case <-ch:
		}
	}
}

func clientCN(state *tls.ConnectionState) string {
	if state != nil && len(state.VerifiedChains) > 0 && len(state.VerifiedChains[0]) > 0 {
		return state.VerifiedChains[0][0].Subject.CommonName
	}
	return ""
}

type grpcService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	r *Receiver
}

func (s grpcService) Export(ctx context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	s.r.calls.Add(1)
	if s.r.Hold.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if s.r.Reject.Load() {
		return nil, status.Error(codes.Unavailable, "receiver rejects exports")
	}
	rec := Request{Body: req, Header: http.Header{}, Received: time.Now()}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for k, vs := range md {
			for _, v := range vs {
				rec.Header.Add(k, v)
			}
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			rec.ClientCN = clientCN(&ti.State)
		}
	}
	s.r.record(rec)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

// StartGRPC serves the OTLP gRPC metrics service on a free loopback port,
// with TLS when tc is not nil, until the test ends.
func StartGRPC(t testing.TB, tc *tls.Config) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	scheme := "http"
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
		scheme = "https"
	}
	r := newReceiver(ln.Addr().String(), scheme)
	srv := grpc.NewServer(opts...)
	colmetricpb.RegisterMetricsServiceServer(srv, grpcService{r: r})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return r
}

// StartHTTP serves OTLP/HTTP protobuf on MetricsPath on a free loopback
// port, with TLS when tc is not nil, until the test ends. Other paths get
// 404 (and are not recorded).
func StartHTTP(t testing.TB, tc *tls.Config) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http"
	if tc != nil {
		ln = tls.NewListener(ln, tc)
		scheme = "https"
	}
	r := newReceiver(ln.Addr().String(), scheme)
	srv := &http.Server{Handler: http.HandlerFunc(r.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	r.calls.Add(1)
	if req.Method != http.MethodPost || req.URL.Path != MetricsPath {
		http.NotFound(w, req)
		return
	}
	if r.Hold.Load() {
		<-req.Context().Done()
		return
	}
	if r.Reject.Load() {
		http.Error(w, "receiver rejects exports", http.StatusServiceUnavailable)
		return
	}
	var body io.Reader = req.Body
	if strings.EqualFold(req.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msg := &colmetricpb.ExportMetricsServiceRequest{}
	if err := proto.Unmarshal(data, msg); err != nil {
		http.Error(w, "not an ExportMetricsServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	rec := Request{Body: msg, Header: req.Header.Clone(), Path: req.URL.Path, Received: time.Now()}
	if req.TLS != nil {
		rec.ClientCN = clientCN(req.TLS)
	}
	r.record(rec)
	out, err := proto.Marshal(&colmetricpb.ExportMetricsServiceResponse{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}
