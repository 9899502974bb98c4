//go:build linux

package bench

// Helpers shared by the attach latency and userspace cost benchmarks: the
// real profi binary run as testutil.StartAgent runs it, its process found
// in /proc, CPU and memory read from /proc, and small statistics.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/testutil"
	"github.com/profi-dev/profi/internal/testutil/testenv"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture Go supports (the kernel's ABI, whatever
// CONFIG_HZ is).
const clockTicks = 100

// agentRun is one profi process started by the benchmark.
type agentRun struct {
	*testutil.Agent
	pid int // the agent's own PID, for /proc/PID/stat and status
}

// fixturesAndAgent builds the stubs and cmd/profi into dir.
func fixturesAndAgent(b *testing.B, dir string) (*testutil.Fixtures, string) {
	b.Helper()
	fx, err := testutil.BuildFixtures(filepath.Join(dir, "fixtures"))
	if errors.Is(err, testutil.ErrNoCompiler) {
		b.Skipf("skipping: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	bin, err := testutil.BuildAgent(dir)
	if err != nil {
		b.Fatal(err)
	}
	return fx, bin
}

// buildC compiles bench/<src> with gcc into dir and returns the binary.
// The stub headers are on the include path; extra goes after the source
// (libraries).
func buildC(b *testing.B, dir, src string, extra ...string) string {
	b.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, strings.TrimSuffix(src, ".c"))
	args := append([]string{"-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
		"-I" + filepath.Join(root, "test", "stubs"), "-o", out, filepath.Join(root, "bench", src)}, extra...)
	cmd := exec.Command("gcc", args...)
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, o)
	}
	return out
}

// startAgent starts the profi binary bin with args (testutil.StartAgent:
// a free loopback port, waits for /ready) and finds its PID. The
// configuration every run shares: no static libcudart (the default path
// does not exist here anyway), info logs.
func startAgent(b *testing.B, bin string, args ...string) *agentRun {
	b.Helper()
	args = append([]string{"--cudart", "/nonexistent/libcudart.so", "--log-level", "info"}, args...)
	a, err := testutil.StartAgent(context.Background(), bin, args...)
	if err != nil {
		b.Fatal(err)
	}
	pid, err := pidOfExe(bin)
	if err != nil {
		_ = a.Stop()
		b.Fatal(err)
	}
	return &agentRun{Agent: a, pid: pid}
}

// stop stops the agent (SIGTERM) and fails the benchmark on an unclean
// exit. It waits up to 5 minutes, not testutil's 10 s: the agent detaches
// every library file still attached, one file after the other, and each
// took about 2 s on our 6.18 VM. It returns how long the agent took to
// exit.
func (a *agentRun) stop(b *testing.B) time.Duration {
	b.Helper()
	// Connections the client dialled but never used are "new" to the
	// server, and its graceful shutdown waits 5 s for them: close them.
	http.DefaultClient.CloseIdleConnections()
	began := time.Now()
	if err := unix.Kill(a.pid, unix.SIGTERM); err != nil {
		b.Errorf("SIGTERM agent: %v", err)
	}
	for deadline := began.Add(5 * time.Minute); !a.Exited() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(began)
	if err := a.Stop(); err != nil {
		b.Errorf("agent did not exit cleanly (after %v): %v\n%s", took.Round(time.Millisecond), err, a.Logs())
	}
	return took
}

// pidOfExe finds the one live process running the file bin (testutil.Agent
// does not expose its PID). bin is a private temporary path, so no other
// process can run it.
func pidOfExe(bin string) (int, error) {
	want, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == want {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("want exactly one process running %s, found %v", want, found)
	}
	return found[0], nil
}

// cpuTime is the CPU time (user + system, all threads) of a process.
func cpuTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which may contain spaces: state is
	// field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// procMem is what /proc/PID/status says about a process's memory, in KiB.
type procMem struct {
	rss, hwm, anon uint64 // VmRSS, VmHWM (peak RSS), RssAnon (RSS less file pages: the binary's text)
}

func memKiB(pid int) (procMem, error) {
	var m procMem
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "VmHWM":
			dst = &m.hwm
		case "RssAnon":
			dst = &m.anon
		default:
			continue
		}
		if *dst, err = strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err != nil {
			return m, err
		}
	}
	if m.rss == 0 || m.hwm == 0 || m.anon == 0 {
		return m, fmt.Errorf("no VmRSS/VmHWM/RssAnon in /proc/%d/status", pid)
	}
	return m, sc.Err()
}

// monoNow is CLOCK_MONOTONIC in ns, the clock the C programs record.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot fail on Linux
	}
	return ts.Nano()
}

// agentStatus is the part of /status the benchmarks read.
type agentStatus struct {
	Attached []struct {
		Library string `json:"library"`
		Path    string `json:"path"`
		PIDs    []int  `json:"pids"`
	} `json:"attached_libraries"`
	Failures []struct {
		Library, Path, Reason, Error string
	} `json:"attach_failures"`
	Hooks []struct {
		Path string `json:"path"`
	} `json:"loader_hooks"`
	ExportedSeries int `json:"exported_series"`
}

func (a *agentRun) status() (*agentStatus, error) {
	var st agentStatus
	if err := a.Status(&st); err != nil {
		return nil, err
	}
	return &st, nil
}

// waitHooks waits until the agent's first pass hooked a dynamic loader:
// from then on a library load triggers a pass.
func (a *agentRun) waitHooks(b *testing.B) {
	b.Helper()
	err := testenv.Eventually(15*time.Second, func() error {
		st, err := a.status()
		if err != nil {
			return err
		}
		if len(st.Hooks) == 0 {
			return errors.New("no dynamic loader hooked yet")
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// waitDrainAfter waits until the agent published a drain that began after
// t: everything counted in the BPF maps before t is in the snapshot that
// /metrics serves from the next request on. It counts drains with the
// agent's drain histogram, not /status's last_drain: /status builds its
// answer from the snapshot it read before it waits for the attacher's
// lock, which a discovery pass holds while it detaches libraries (seconds
// each), so it can answer with a snapshot older than the request.
// Drains run one after the other: if a scrape that began after t saw c
// drains, drain c+2 began after drain c+1 ended, hence after t.
func (a *agentRun) waitDrainAfter(t time.Time, timeout time.Duration) error {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
	drains := func() (uint64, error) {
		mfs, err := a.Metrics()
		if err != nil {
			return 0, err
		}
		n, _ := histSums(mfs, "profi_system_aggregated_map_drain_duration_seconds")
		return n, nil
	}
	deadline := time.Now().Add(timeout)
	c0, err := drains()
	for err != nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		c0, err = drains()
	}
	if err != nil {
		return err
	}
	for {
		c, err := drains()
		if err == nil && c >= c0+2 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no drain began after %v within %v (drains: %d then %d, %v)", t, timeout, c0, c, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrape fetches /metrics and returns the body and the wall time the
// request took, body read included.
func (a *agentRun) scrape() ([]byte, time.Duration, error) {
	began := time.Now()
	resp, err := http.Get(a.URL + "/metrics")
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	took := time.Since(began)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	return body, took, err
}

// histSums returns count and sum of a (label-less) histogram family.
func histSums(mfs map[string]*dto.MetricFamily, name string) (count uint64, sum float64) {
	if mf := mfs[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

// total sums the samples of a family whose labels include all of match.
func total(mfs map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	var v float64
	for _, s := range testutil.Samples(mfs[name]) {
		if labelsMatch(s.Labels, match) {
			v += s.Value
		}
	}
	return v
}

func labelsMatch(labels, match map[string]string) bool {
	for k, want := range match {
		if labels[k] != want {
			return false
		}
	}
	return true
}

// percentile is the nearest-rank percentile (p in (0, 100]) of xs: the
// smallest value with at least p% of the values at or below it.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// fmtMs formats a duration in ms (∞ for a miss).
func fmtMs(ms float64) string {
	switch {
	case math.IsInf(ms, 1):
		return "∞"
	case math.IsNaN(ms):
		return "—"
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

// fmtInt formats n with thousands separators.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// child is a benchmark C program driven over stdin/stdout, one line each.
type child struct {
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	lines  chan string // closed at EOF
	stderr bytes.Buffer
	done   chan struct{} // closed once Wait returned
	err    error
}

// startChild starts bin with args; its stdout is read line by line.
func startChild(bin string, args ...string) (*child, error) {
	c := &child{cmd: exec.Command(bin, args...), lines: make(chan string, 4), done: make(chan struct{})}
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	c.pid = c.cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = c.cmd.Wait() // after stdout hit EOF, as exec requires
		close(c.done)
	}()
	return c, nil
}

// line returns the next line, or an error at EOF or after timeout.
func (c *child) line(timeout time.Duration) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.done
			return "", fmt.Errorf("%s exited (%v) without answering; stderr: %s", c.cmd.Path, c.err, c.stderr.String())
		}
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("%s (pid %d) did not answer within %v", c.cmd.Path, c.pid, timeout)
	}
}

// ask sends one command line and returns the answer line.
func (c *child) ask(cmd string, timeout time.Duration) (string, error) {
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		return "", fmt.Errorf("send %q to pid %d: %w", cmd, c.pid, err)
	}
	return c.line(timeout)
}

// exit asks the program to exit and waits (kills it after 10 s); the
// error is a non-zero exit.
func (c *child) exit() error {
	_, _ = io.WriteString(c.stdin, "exit\n") // fails harmlessly if it is gone
	_ = c.stdin.Close()
	go func() { //nolint:revive // drain stdout so the reader goroutine can finish
		for range c.lines {
		}
	}()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("pid %d did not exit within 10 s; killed", c.pid)
	}
	if c.err != nil {
		return fmt.Errorf("pid %d: %v; stderr: %s", c.pid, c.err, c.stderr.String())
	}
	return nil
}

// copyExecutable copies the file from to a new file to (mode 0755): a
// library with an inode of its own.
func copyExecutable(from, to string) error {
	raw, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, raw, 0o755)
}
