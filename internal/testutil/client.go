package testutil

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Client is one of the small ground-truth workloads (test/workloads
// launch13.c, drvapi.c, rtclient.c, graphs.c): it prints "ready PID",
// waits for "go" on stdin, makes its calls, prints its ground truth as one
// JSON line and exits at EOF. launch13.c and test/nvcc/client.cu also take
// "run" (Run): they print "running" and make calls, at least as many as
// their arguments say, until "stop" (Stop), so that a test's adversary
// (stalls, a handover), not the clock, decides how long they run.
type Client struct {
	Bin   string
	PID   int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// StartClient starts bin with env added to the test's environment and
// waits for its "ready" line; the test's cleanup ends it.
func StartClient(t *testing.T, env []string, bin string, args ...string) *Client {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("%s: %q, %v", bin, line, err)
	}
	return &Client{Bin: bin, PID: cmd.Process.Pid, cmd: cmd, stdin: stdin, out: r}
}

// Go tells the client to make its calls and returns its ground-truth line.
func (c *Client) Go(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("%s output: %v", c.Bin, err)
	}
	return line
}

// Run tells the client to make calls until Stop and returns once it is
// making them.
func (c *Client) Run(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "run\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := c.out.ReadString('\n'); err != nil || line != "running\n" {
		t.Fatalf("%s: %q, %v; want \"running\"", c.Bin, line, err)
	}
}

// Stop tells a running client to stop: it makes the rest of the calls its
// arguments ask for, if any, and Stop returns its ground-truth line.
func (c *Client) Stop(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "stop\n"); err != nil {
		t.Fatal(err)
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("%s output: %v", c.Bin, err)
	}
	return line
}

// Exit ends the client (EOF on its stdin) and waits until it has exited.
func (c *Client) Exit(t *testing.T) {
	t.Helper()
	_ = c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("%s: %v", c.Bin, err)
	}
}
