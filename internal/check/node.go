package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/nvml"
)

func procCheck(env *Env) Result {
	root := env.Config.ProcPath
	const fix = "mount the host's procfs and pass --proc-path (the chart mounts /proc at /host/proc), run with hostPID: true, and grant CAP_SYS_PTRACE"
	entries, err := os.ReadDir(root)
	if err != nil {
		return Result{Name: "procfs", Status: Fail, Detail: "--proc-path " + root + ": " + err.Error(), Fix: fix}
	}
	pids := 0
	for _, e := range entries {
		if e.Name()[0] >= '0' && e.Name()[0] <= '9' {
			pids++
		}
	}
	if pids == 0 {
		return Result{Name: "procfs", Status: Fail, Detail: "--proc-path " + root + " lists no process: not a procfs", Fix: fix}
	}
	// Some processes (a sandbox's PID 1, non-dumpable ones) refuse maps
	// even to root; what matters is that other processes' maps are readable.
	self, readable, refused := strconv.Itoa(os.Getpid()), 0, ""
	for _, e := range entries {
		if n := e.Name(); n[0] >= '0' && n[0] <= '9' && n != self {
			f, err := os.Open(filepath.Join(root, n, "maps"))
			if err == nil {
				_, err = f.Read(make([]byte, 1))
				f.Close()
			}
			if err == nil || errors.Is(err, io.EOF) { // kernel threads map nothing
				readable++
			} else if refused == "" {
				refused = err.Error()
			}
		}
	}
	if readable == 0 {
		return Result{Name: "procfs", Status: Fail, Detail: fmt.Sprintf("--proc-path %s: no other process's maps is readable (%s)", root, refused), Fix: fix}
	}
	detail := fmt.Sprintf("--proc-path %s: maps of %d of %d processes readable", root, readable, pids-1)
	// hostPID: BPF sees PIDs of the initial PID namespace; the agent must
	// live there and --proc-path must show it under its own PID.
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return Result{Name: "procfs", Status: Warn, Detail: detail + "; cannot read the agent's PID namespace: " + err.Error(), Fix: fix}
	}
	if own != initPIDNamespace {
		return Result{Name: "procfs", Status: Fail, Detail: fmt.Sprintf("%s; the agent runs in PID namespace %s, not the node's (%s): the PIDs BPF reports would not match procfs", detail, own, initPIDNamespace),
			Fix: "set hostPID: true on the agent's pod (the chart does)"}
	}
	if st, err := discover.ReadStartTime(root, os.Getpid()); err != nil {
		return Result{Name: "procfs", Status: Fail, Detail: fmt.Sprintf("%s; the agent itself (PID %d) is not in --proc-path (%v): it is not the node's procfs", detail, os.Getpid(), err), Fix: fix}
	} else if mine, err := discover.ReadStartTime("/proc", os.Getpid()); err == nil && mine != st {
		return Result{Name: "procfs", Status: Fail, Detail: fmt.Sprintf("%s; PID %d in --proc-path is another process than the agent: it is not the node's procfs", detail, os.Getpid()), Fix: fix}
	}
	return Result{Name: "procfs", Status: OK, Detail: detail + "; host PID namespace"}
}

// initPIDNamespace is the initial PID namespace (PROC_PID_INIT_INO), the
// one hostPID pods share with the node.
const initPIDNamespace = "pid:[4026531836]"

func nvmlCheck(env *Env) Result {
	if env.Config.DisableNVML {
		return Result{Name: "nvml", Status: OK, Detail: "off (--disable-nvml)"}
	}
	const fix = "on a GPU node, install the NVIDIA driver and expose it to the agent (NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=compute,utility with the NVIDIA container runtime, or PROFI_NVML_LIBRARY=/path/libnvidia-ml.so.1); on a node without GPUs pass --disable-nvml"
	if env.pretend("nvml") {
		return Result{Name: "nvml", Status: Warn, Detail: "NVML unavailable: forced off; GPU metrics (profi_gpu_*) will be missing", Fix: fix}
	}
	lib := nvml.NewLibrary()
	type res struct {
		driver string
		n      int
		err    error
	}
	done := make(chan res, 1)
	// A wedged driver can block NVML calls for minutes: never wait longer
	// than the timeout (the goroutine is abandoned, as the poller does).
	go func() {
		var r res
		if r.err = lib.Init(); r.err != nil {
			done <- r
			return
		}
		defer func() { _ = lib.Shutdown() }()
		if r.driver, r.err = lib.DriverVersion(); r.err == nil {
			r.n, r.err = lib.DeviceCount()
		}
		done <- r
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return Result{Name: "nvml", Status: Warn, Detail: fmt.Sprintf("NVML unavailable (%v): GPU metrics (profi_gpu_*) will be missing; CUDA/NCCL calls are still counted", r.err), Fix: fix}
		}
		return Result{Name: "nvml", Status: OK, Detail: fmt.Sprintf("NVIDIA driver %s, %d GPU(s)", r.driver, r.n)}
	case <-time.After(env.Timeout):
		return Result{Name: "nvml", Status: Warn, Detail: fmt.Sprintf("NVML did not answer within %s: the driver may be hung", env.Timeout), Fix: "check the driver (nvidia-smi); profi's poller reports profi_gpu_up 0 meanwhile"}
	}
}

func otlpCheck(ctx context.Context, env *Env) Result {
	o := env.Config.OTLP
	if !o.Enabled() {
		return Result{Name: "otlp", Status: OK, Detail: "OTLP push off (no endpoint)"}
	}
	host := o.Endpoint
	if u, err := url.Parse(o.Endpoint); err == nil && u.Host != "" {
		host = u.Host
		if u.Port() == "" {
			port := "80"
			if u.Scheme == "https" {
				port = "443"
			}
			host = net.JoinHostPort(u.Hostname(), port)
		}
	}
	d := net.Dialer{Timeout: env.Timeout}
	ctx, cancel := context.WithTimeout(ctx, env.Timeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		reason := err.Error()
		var op *net.OpError
		if errors.As(err, &op) && op.Timeout() {
			reason = "no answer within " + env.Timeout.String()
		}
		return Result{Name: "otlp", Status: Fail, Detail: fmt.Sprintf("OTLP endpoint %s (%s): cannot connect to %s: %s", o.Endpoint, o.Protocol, host, reason),
			Fix: "start the collector or correct --otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT (gRPC listens on 4317, HTTP on 4318); a network policy may block the node"}
	}
	_ = c.Close()
	return Result{Name: "otlp", Status: OK, Detail: fmt.Sprintf("OTLP endpoint %s (%s): TCP connect to %s ok", o.Endpoint, o.Protocol, host)}
}
