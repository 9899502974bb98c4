// Command podrun is the entrypoint of the test node's images
// (internal/testutil/kubetest/node.go, test/e2e/node_test.go): a static
// binary that needs nothing from the image but itself.
//
//	podrun pause
//	    the pod sandbox's process: waits for SIGTERM or SIGINT.
//	podrun run [--crash-after DURATION] -- WORKLOAD [ARGS...]
//	    drives test/workloads/workload.c's stdin protocol from inside a
//	    container. Each SIGUSR1 (sent by the test, which runs on the same
//	    host) runs one measured phase and prints its ground truth to the
//	    container's log as "truth <JSON>", which the test reads through the
//	    API server. With --crash-after the first phase is followed, that
//	    long after, by the workload's "nullstore" (a NULL store in its own
//	    code): the workload dies of SIGSEGV, and podrun exits 139 as a
//	    shell would, so the kubelet restarts the container. A duration
//	    past the agent's --crash-window makes it the ordinary crash of a
//	    pod's own code, seconds after its last CUDA call. SIGTERM ends the
//	    workload ("exit") and podrun with it.
//
// Every line podrun prints is "<word> ..." so the test can parse the log.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "pause":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
	case "run":
		os.Exit(run(os.Args[2:]))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: podrun pause | podrun run [--crash-after DURATION] -- WORKLOAD [ARGS...]")
	os.Exit(2)
}

func run(args []string) int {
	crashAfter := time.Duration(-1)
	for len(args) > 1 && args[0] == "--crash-after" {
		d, err := time.ParseDuration(args[1])
		if err != nil {
			usage()
		}
		crashAfter, args = d, args[2:]
	}
	if len(args) < 2 || args[0] != "--" {
		usage()
	}
	args = args[1:]

	// Subscribed before the workload starts, so a signal the test sends
	// as soon as it sees the process is never lost.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	lines := bufio.NewReader(stdout)
	first, err := lines.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "ready ") {
		return fail(fmt.Errorf("workload's first line %q: %v", first, err))
	}
	// The workload's pid in the host's pid namespace is what the agent
	// labels; the test finds it there by this process's container.
	fmt.Printf("ready %d\n", cmd.Process.Pid)

	for s := range sig {
		if s != syscall.SIGUSR1 {
			_, _ = io.WriteString(stdin, "exit\n")
			return exitCode(cmd.Wait())
		}
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			return fail(err)
		}
		truth, err := lines.ReadString('\n')
		if err != nil {
			return fail(fmt.Errorf("phase: %w (%v)", err, cmd.Wait()))
		}
		fmt.Printf("truth %s", truth)
		if crashAfter >= 0 {
			time.Sleep(crashAfter)
			fmt.Println("crash nullstore")
			_, _ = io.WriteString(stdin, "nullstore\n")
			return exitCode(cmd.Wait())
		}
	}
	return 0
}

// exitCode is the status a shell would give: 128+signal for a workload
// killed by a signal.
func exitCode(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return fail(err)
		}
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		fmt.Printf("died %s\n", ws.Signal())
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

func fail(err error) int {
	fmt.Printf("error %v\n", err)
	return 1
}
