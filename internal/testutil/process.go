package testutil

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Option configures StartWorkload.
type Option func(*startOptions)

type startOptions struct {
	dir          string
	env          []string
	wrapper      []string
	sysProcAttr  *syscall.SysProcAttr
	readyTimeout time.Duration
	runTimeout   time.Duration
}

// WithDir sets the working directory.
func WithDir(dir string) Option { return func(o *startOptions) { o.dir = dir } }

// WithEnv sets the whole environment (exec.Cmd.Env semantics: nil inherits).
func WithEnv(env []string) Option { return func(o *startOptions) { o.env = env } }

// WithWrapper runs the workload under a command prefix, e.g.
// "unshare", "--mount", "--". Workload.PID is then still the workload's own.
func WithWrapper(argv ...string) Option {
	return func(o *startOptions) { o.wrapper = argv }
}

// WithSysProcAttr sets exec.Cmd.SysProcAttr.
func WithSysProcAttr(a *syscall.SysProcAttr) Option {
	return func(o *startOptions) { o.sysProcAttr = a }
}

// WithReadyTimeout bounds the wait for "ready" (default 30 s).
func WithReadyTimeout(d time.Duration) Option { return func(o *startOptions) { o.readyTimeout = d } }

// WithRunTimeout bounds each Run (default 120 s: probed runs are slow).
func WithRunTimeout(d time.Duration) Option { return func(o *startOptions) { o.runTimeout = d } }

// Workload is a running workload process driven over its stdin protocol.
type Workload struct {
	Cmd *exec.Cmd
	PID int // the workload's PID as it printed it (not the wrapper's)

	opts    startOptions
	stdin   io.WriteCloser
	lines   chan string   // stdout lines; closed at EOF
	eof     atomic.Bool   // stdout hit EOF: the workload closed it
	quit    chan struct{} // closed by Stop: stop delivering lines
	exited  chan struct{} // closed once Cmd.Wait returned (wrapper, if any)
	waitErr error         // Cmd.Wait's result, valid after exited
	stderr  lockedBuffer

	mu       sync.Mutex // serialises protocol exchanges
	stopOnce sync.Once
	stopErr  error
}

const (
	stopTimeout = 10 * time.Second
	loadTimeout = 30 * time.Second
)

// StartWorkload starts bin with args and waits until it prints "ready <pid>".
// Cancelling ctx kills the process (the wrapper, when one is used).
func StartWorkload(ctx context.Context, bin string, args []string, opts ...Option) (*Workload, error) {
	w := &Workload{
		opts:   startOptions{readyTimeout: 30 * time.Second, runTimeout: 120 * time.Second},
		lines:  make(chan string, 16),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	for _, o := range opts {
		o(&w.opts)
	}
	argv := append(append(slices.Clone(w.opts.wrapper), bin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = w.opts.dir
	cmd.Env = w.opts.env
	cmd.SysProcAttr = w.opts.sysProcAttr
	cmd.Stderr = &w.stderr
	// Bounds Wait if a wrapper's child outlives it holding stderr.
	cmd.WaitDelay = stopTimeout
	w.Cmd = cmd
	var err error
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	// A plain pipe rather than StdoutPipe: Cmd.Wait must not close stdout
	// under the reader, so the two can run independently.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("testutil: %w", err)
	}
	cmd.Stdout = pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("testutil: start %s: %w", strings.Join(argv, " "), err)
	}
	go w.readLoop(pr)
	go func() {
		w.waitErr = cmd.Wait()
		close(w.exited)
	}()

	line, err := w.waitLine(w.opts.readyTimeout, `"ready <pid>"`)
	if err == nil {
		var pid int
		if _, serr := fmt.Sscanf(line, "ready %d", &pid); serr != nil || pid <= 0 {
			err = fmt.Errorf("testutil: workload printed %q, want \"ready <pid>\"", line)
		}
		w.PID = pid
	}
	if err != nil {
		w.kill()
		return nil, err
	}
	return w, nil
}

// readLoop forwards stdout lines until EOF. It keeps draining stdout after
// Stop so the workload never blocks writing to it.
func (w *Workload) readLoop(stdout *os.File) {
	defer stdout.Close()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // JSON lines grow with streams
	for sc.Scan() {
		select {
		case w.lines <- sc.Text():
		case <-w.quit:
		}
	}
	_, _ = io.Copy(io.Discard, stdout) // after a scan error (line too long)
	w.eof.Store(true)
	close(w.lines)
}

// waitLine returns the next stdout line, or an error with the workload's
// stderr when it exits or timeout passes first.
func (w *Workload) waitLine(timeout time.Duration, what string) (string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line, ok := <-w.lines:
		if ok {
			return line, nil
		}
		select {
		case <-w.exited:
		case <-timer.C:
		}
		return "", w.errorf("exited (%v) while waiting for %s", w.exitStatus(), what)
	case <-timer.C:
		return "", w.errorf("timed out after %v waiting for %s", timeout, what)
	}
}

func (w *Workload) exitStatus() error {
	select {
	case <-w.exited:
		return w.waitErr
	default:
		return fmt.Errorf("exit status not yet known")
	}
}

func (w *Workload) errorf(format string, args ...any) error {
	return fmt.Errorf("testutil: workload %s (pid %d): %s; stderr:\n%s",
		strings.Join(w.Cmd.Args, " "), w.PID, fmt.Sprintf(format, args...), w.Stderr())
}

func (w *Workload) send(cmd string) error {
	if _, err := io.WriteString(w.stdin, cmd+"\n"); err != nil {
		return w.errorf("sending %q: %v", cmd, err)
	}
	return nil
}

// Stderr returns what the workload wrote to stderr so far.
func (w *Workload) Stderr() string { return w.stderr.String() }

// Load makes the dlopen build load the library ("load" -> "loaded"). The
// linked build answers too, so callers may treat both builds alike.
func (w *Workload) Load() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("load"); err != nil {
		return err
	}
	line, err := w.waitLine(loadTimeout, `"loaded"`)
	if err != nil {
		return err
	}
	if line != "loaded" {
		return w.errorf("printed %q, want \"loaded\"", line)
	}
	return nil
}

// Run runs one measured phase ("go") and returns the cumulative ground truth
// of all phases so far, after checking its internal consistency.
func (w *Workload) Run() (*GroundTruth, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("go"); err != nil {
		return nil, err
	}
	return w.truth()
}

// RunUntil runs one measured phase that lasts as long as adversary does:
// "run", then adversary once every thread of the workload is making calls
// ("running"), then "stop"; each thread makes at least --iters iterations.
// It returns the cumulative ground truth, as Run. The workload's
// --pause-us bounds how many calls it makes meanwhile.
func (w *Workload) RunUntil(adversary func()) (*GroundTruth, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send("run"); err != nil {
		return nil, err
	}
	line, err := w.waitLine(w.opts.runTimeout, `"running"`)
	if err != nil {
		return nil, err
	}
	if line != "running" {
		return nil, w.errorf("printed %q, want \"running\"", line)
	}
	adversary()
	if err := w.send("stop"); err != nil {
		return nil, err
	}
	return w.truth()
}

// truth reads the ground truth a phase prints at its end.
func (w *Workload) truth() (*GroundTruth, error) {
	line, err := w.waitLine(w.opts.runTimeout, "ground truth JSON")
	if err != nil {
		return nil, err
	}
	var gt GroundTruth
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields() // a renamed key must fail loudly, not read as 0
	if err := dec.Decode(&gt); err != nil {
		return nil, w.errorf("bad ground truth %q: %v", line, err)
	}
	if gt.PID != w.PID {
		return nil, w.errorf("ground truth pid %d != ready pid %d", gt.PID, w.PID)
	}
	if err := gt.Check(); err != nil {
		return nil, err
	}
	return &gt, nil
}

// Die sends cmd, a command after which the workload dies ("segv" and
// "ill": one probed call, then that fault), and waits for it to exit. It
// returns the kernel's wait status of the workload (no wrapper).
func (w *Workload) Die(cmd string) (syscall.WaitStatus, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(cmd); err != nil {
		return 0, err
	}
	select {
	case <-w.exited:
	case <-time.After(stopTimeout):
		return 0, w.errorf("still running %v after %q", stopTimeout, cmd)
	}
	ws, ok := w.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return 0, w.errorf("no wait status")
	}
	return ws, nil
}

// Signal sends sig to the workload and waits for it to exit; it returns
// the kernel's wait status (no wrapper).
func (w *Workload) Signal(sig syscall.Signal) (syscall.WaitStatus, error) {
	if err := w.Cmd.Process.Signal(sig); err != nil {
		return 0, w.errorf("signal %v: %v", sig, err)
	}
	select {
	case <-w.exited:
	case <-time.After(stopTimeout):
		return 0, w.errorf("still running %v after %v", stopTimeout, sig)
	}
	ws, ok := w.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return 0, w.errorf("no wait status")
	}
	return ws, nil
}

// Stop asks the workload to exit, waits, and kills it after a timeout. It is
// idempotent; the error reports a non-zero exit or a needed kill.
func (w *Workload) Stop() error {
	w.stopOnce.Do(func() {
		close(w.quit)
		_, _ = io.WriteString(w.stdin, "exit\n") // fails harmlessly if it is gone
		_ = w.stdin.Close()                      // EOF also means exit
		select {
		case <-w.exited:
			if w.waitErr != nil {
				w.stopErr = w.errorf("exit: %v", w.waitErr)
			}
		case <-time.After(stopTimeout):
			w.kill()
			w.stopErr = w.errorf("did not exit within %v; killed", stopTimeout)
		}
	})
	return w.stopErr
}

// kill kills the process, and the workload itself when behind a wrapper, and
// waits until it is reaped.
func (w *Workload) kill() {
	select {
	case <-w.exited:
		return
	default:
	}
	if w.PID > 0 && w.PID != w.Cmd.Process.Pid && !w.eof.Load() {
		// Behind a wrapper; its stdout still open says the PID is still it.
		_ = syscall.Kill(w.PID, syscall.SIGKILL)
	}
	_ = w.Cmd.Process.Kill()
	<-w.exited
}

// lockedBuffer is an io.Writer safe to read while exec copies stderr into it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
