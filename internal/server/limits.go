package server

import (
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits bound what clients can hold of the agent: time, connections,
// handshakes and concurrent renders (issue 17 item 4, docs/SECURITY.md
// "Resource limits"). Zero fields take the defaults below.
type Limits struct {
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request (all are bodiless GETs).
	ReadTimeout time.Duration
	// WriteTimeout bounds a response from the end of its request header:
	// a /metrics client that never reads is cut off then.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection waiting for its next
	// request.
	IdleTimeout time.Duration
	// MaxConns bounds open connections (TLS handshakes included).
	MaxConns int
	// MaxHandshakes bounds concurrent TLS handshakes (one goroutine each).
	MaxHandshakes int
	// MaxRequests bounds concurrent /metrics and /status requests past
	// authentication; /health and /ready are not bounded (they cost
	// nothing and the kubelet must get through).
	MaxRequests int
}

// Defaults of Limits (docs/OPERATIONS.md "HTTP limits").
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	// A /metrics body of 5·10⁴ series (7 MiB of text) renders in well
	// under a second (docs/BENCHMARK.md, "Userspace cost vs series and call
	// rate"); a minute leaves room for a slow network at ten times that size
	// and still bounds a stalled reader.
	DefaultWriteTimeout = time.Minute
	// Longer than a 60 s scrape interval, so a scraper's keep-alive
	// connection survives between scrapes.
	DefaultIdleTimeout   = 90 * time.Second
	DefaultMaxConns      = 256
	DefaultMaxHandshakes = 32
	DefaultMaxRequests   = 8
)

// Refusal reasons (profi_system_http_refused_total{reason}).
const (
	// RefusedConnLimit: a new connection closed at once, every slot being
	// busy with a request.
	RefusedConnLimit = "conn_limit"
	// RefusedConnEvicted: the oldest idle connection (keep-alive, or no
	// complete request header yet, or in its TLS handshake) closed to make
	// room for a new one.
	RefusedConnEvicted = "conn_evicted"
	// RefusedHandshakeEvicted: the oldest TLS handshake in progress closed
	// to make room for a new one.
	RefusedHandshakeEvicted = "handshake_evicted"
	// RefusedRequestLimit: /metrics or /status answered 503 with
	// Retry-After, MaxRequests being in progress.
	RefusedRequestLimit = "request_limit"
)

// RefusalReasons lists every reason, for initialising counters and tests.
var RefusalReasons = []string{RefusedConnLimit, RefusedConnEvicted, RefusedHandshakeEvicted, RefusedRequestLimit}

func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.ReadTimeout, DefaultReadTimeout)
	def(&l.WriteTimeout, DefaultWriteTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	defInt(&l.MaxConns, DefaultMaxConns)
	defInt(&l.MaxHandshakes, DefaultMaxHandshakes)
	defInt(&l.MaxRequests, DefaultMaxRequests)
	return l
}

// slots is a bounded set of holders (connections, handshakes). At the
// bound a newcomer takes the slot of the holder that has been idle the
// longest; when every holder is busy the newcomer is refused. Evicting the
// oldest idle holder rather than refusing the newcomer keeps the agent
// reachable: clients that open connections and sit on them cannot lock a
// scraper out, they only lose their own oldest connections.
type slots struct {
	max int
	mu  sync.Mutex
	seq uint64
	set map[*slot]struct{}
}

type slot struct {
	owner *slots
	since uint64 // sequence number of the last idle transition
	busy  bool
	close func() // evicts the holder
}

func newSlots(max int) *slots { return &slots{max: max, set: map[*slot]struct{}{}} }

// acquire takes a slot for a holder closed by closeFn, evicting the
// longest-idle holder when full. It returns nil when every holder is busy,
// and whether a holder was evicted.
func (s *slots) acquire(closeFn func()) (sl *slot, evicted bool) {
	s.mu.Lock()
	var victim *slot
	if len(s.set) >= s.max {
		for c := range s.set {
			if !c.busy && (victim == nil || c.since < victim.since) {
				victim = c
			}
		}
		if victim == nil {
			s.mu.Unlock()
			return nil, false
		}
		delete(s.set, victim)
	}
	s.seq++
	sl = &slot{owner: s, since: s.seq, close: closeFn}
	s.set[sl] = struct{}{}
	s.mu.Unlock()
	if victim != nil {
		victim.close() // outside the lock: closing may call release
	}
	return sl, victim != nil
}

// setBusy marks the holder busy (serving a request) or idle again.
func (sl *slot) setBusy(busy bool) {
	s := sl.owner
	s.mu.Lock()
	if !busy && sl.busy {
		s.seq++
		sl.since = s.seq
	}
	sl.busy = busy
	s.mu.Unlock()
}

// release frees the slot (idempotent; a no-op after an eviction).
func (sl *slot) release() {
	s := sl.owner
	s.mu.Lock()
	delete(s.set, sl)
	s.mu.Unlock()
}

// limitListener bounds the connections open at once (see slots).
type limitListener struct {
	net.Listener
	slots  *slots
	refuse func(reason string)
	open   func(delta float64)
}

type limitedConn struct {
	net.Conn
	slot  *slot
	once  sync.Once
	onEnd func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.slot.release()
		c.onEnd()
	})
	return err
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &limitedConn{Conn: raw, onEnd: func() { l.open(-1) }}
		sl, evicted := l.slots.acquire(func() { _ = c.Close() })
		if sl == nil {
			l.refuse(RefusedConnLimit)
			_ = raw.Close()
			continue
		}
		if evicted {
			l.refuse(RefusedConnEvicted)
		}
		c.slot = sl
		l.open(1)
		return c, nil
	}
}

// connState is the http.Server hook that marks a connection busy while it
// serves a request: only idle connections can be evicted.
func connState(c net.Conn, st http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateActive:
		lc.slot.setBusy(true)
	case http.StateIdle:
		lc.slot.setBusy(false)
	case http.StateHijacked, http.StateClosed:
		_ = lc.Close()
	}
}

// bounded returns a wrapper that serves a handler while fewer than max
// requests of all the handlers it wraps are in progress, and answers 503
// with Retry-After otherwise: renders of /metrics cost memory in
// proportion to the series, so their number is bounded.
func bounded(max int, refuse func(string)) func(http.Handler) http.Handler {
	sem := make(chan struct{}, max)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case sem <- struct{}{}:
			default:
				refuse(RefusedRequestLimit)
				w.Header().Set("Retry-After", strconv.Itoa(1))
				http.Error(w, "too many concurrent requests, retry", http.StatusServiceUnavailable)
				return
			}
			defer func() { <-sem }()
			next.ServeHTTP(w, r)
		})
	}
}

// LimitMetrics are the counters of the limits; nil fields are not updated.
type LimitMetrics struct {
	Refused     *prometheus.CounterVec // reason
	Connections prometheus.Gauge       // open connections
}

func (m LimitMetrics) refuse(reason string) {
	if m.Refused != nil {
		m.Refused.WithLabelValues(reason).Inc()
	}
}

func (m LimitMetrics) open(delta float64) {
	if m.Connections != nil {
		m.Connections.Add(delta)
	}
}
