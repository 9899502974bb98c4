package testutil

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/profi-dev/profi/internal/testutil/testenv"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// BuildAgent compiles cmd/profi into dir and returns the binary's path.
func BuildAgent(dir string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "profi")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/profi")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/profi: %w\n%s", err, out)
	}
	return bin, nil
}

// Agent is a running profi binary.
type Agent struct {
	URL string // http://127.0.0.1:PORT
	// HTTP and Token, where set, are the client and the bearer token Get
	// uses (an agent serving HTTPS with bearer auth); http.DefaultClient
	// and no token otherwise.
	HTTP  *http.Client
	Token string
	cmd   *exec.Cmd
	logs  *lockedBuffer
	once  sync.Once
	done  chan struct{}
	err   error
}

// StartAgent runs bin with args plus a free loopback --listen address,
// and waits until /ready answers 200.
func StartAgent(ctx context.Context, bin string, args ...string) (*Agent, error) {
	return startAgent(ctx, bin, "/ready", args)
}

// StartAgentServing is StartAgent for an agent that is not expected to be
// ready yet (a pod watch that cannot list): it waits for /health only.
func StartAgentServing(ctx context.Context, bin string, args ...string) (*Agent, error) {
	return startAgent(ctx, bin, "/health", args)
}

func startAgent(ctx context.Context, bin, probe string, args []string) (*Agent, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	return StartAgentCommand(ctx, addr, probe, append([]string{bin, "--listen", addr}, args...))
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// StartAgentCommand runs argv, a command line that starts an agent listening
// on addr (the agent binary itself, or a wrapper such as `podman run` that
// starts it and forwards SIGTERM to it), and waits until probe ("/ready" or
// "/health") answers 200 there.
func StartAgentCommand(ctx context.Context, addr, probe string, argv []string) (*Agent, error) {
	a := &Agent{URL: "http://" + addr, logs: &lockedBuffer{}, done: make(chan struct{})}
	a.cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	a.cmd.Stdout = a.logs
	a.cmd.Stderr = a.logs
	a.cmd.Env = append(os.Environ(), "PROFI_LOG_LEVEL=debug")
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-a.done:
			return nil, fmt.Errorf("agent exited before ready: %v\n%s", a.err, a.logs.String())
		default:
		}
		if resp, err := http.Get(a.URL + probe); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return a, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = a.Stop() // the readiness failure is the error worth reporting
	return nil, fmt.Errorf("agent: %s not 200 after 30s\n%s", probe, a.logs.String())
}

// PID is the agent's process ID.
func (a *Agent) PID() int { return a.cmd.Process.Pid }

// Logs returns what the agent printed so far.
func (a *Agent) Logs() string { return a.logs.String() }

// Exited reports whether the agent process has ended.
func (a *Agent) Exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM and waits (SIGKILL after 10 s); idempotent. It
// returns the exit error of an unclean exit.
func (a *Agent) Stop() error {
	a.once.Do(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		// Closing each classic uprobe link waits for an RCU grace period,
		// and with --no-uprobe-multi the driver library alone has ~70.
		case <-time.After(45 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	})
	return a.err
}

// Get fetches a path and returns status and body.
func (a *Agent) Get(path string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, a.URL+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	c := a.HTTP
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Metrics scrapes /metrics and parses the text exposition.
func (a *Agent) Metrics() (map[string]*dto.MetricFamily, error) {
	code, body, err := a.Get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(string(body)))
}

// Status fetches /status and decodes it into v.
func (a *Agent) Status(v any) error {
	code, body, err := a.Get("/status")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("/status: HTTP %d", code)
	}
	return json.Unmarshal(body, v)
}

// Series is one sample of a scraped family with its labels.
type Series struct {
	Labels map[string]string
	Value  float64
}

// Samples flattens a family into label maps and values (counter, gauge or
// untyped). Nil family gives nil.
func Samples(mf *dto.MetricFamily) []Series {
	if mf == nil {
		return nil
	}
	var out []Series
	for _, m := range mf.GetMetric() {
		s := Series{Labels: map[string]string{}}
		for _, l := range m.GetLabel() {
			s.Labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Counter != nil:
			s.Value = m.GetCounter().GetValue()
		case m.Gauge != nil:
			s.Value = m.GetGauge().GetValue()
		case m.Untyped != nil:
			s.Value = m.GetUntyped().GetValue()
		case m.Histogram != nil:
			s.Value = float64(m.GetHistogram().GetSampleCount())
		}
		out = append(out, s)
	}
	return out
}

// LogLines returns the agent's log lines that contain s.
func (a *Agent) LogLines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(a.logs.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			out = append(out, sc.Text())
		}
	}
	return out
}
