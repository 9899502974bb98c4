// Command profi is the node agent: it finds processes that map CUDA
// libraries, attaches uprobes to those libraries, and serves the
// aggregated calls as Prometheus metrics. This file only wires packages
// together; see ARCHITECTURE.md at the repository root for the data flow.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/aggregate"
	"github.com/profi-dev/profi/internal/attach"
	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/breaker"
	"github.com/profi-dev/profi/internal/budget"
	"github.com/profi-dev/profi/internal/check"
	"github.com/profi-dev/profi/internal/collector"
	"github.com/profi-dev/profi/internal/config"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/explain"
	"github.com/profi-dev/profi/internal/gpu"
	"github.com/profi-dev/profi/internal/k8s"
	"github.com/profi-dev/profi/internal/kbugs"
	"github.com/profi-dev/profi/internal/kmsg"
	"github.com/profi-dev/profi/internal/kwatch"
	"github.com/profi-dev/profi/internal/nvml"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/otlp"
	"github.com/profi-dev/profi/internal/server"
	"github.com/profi-dev/profi/internal/status"
	"github.com/profi-dev/profi/internal/tenant"
	"github.com/profi-dev/profi/internal/top"
	"github.com/profi-dev/profi/internal/xid"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// subcommands are the operator tools; without one of these as the first
// argument profi runs the agent, with exactly its flags.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) int{
	"check":   check.Main,
	"explain": explain.Main,
	"top":     top.Main,
}

func main() {
	if len(os.Args) > 1 {
		if cmd, ok := subcommands[os.Args[1]]; ok {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			code := cmd(ctx, os.Args[2:], os.Stdout, os.Stderr)
			stop()
			os.Exit(code)
		}
	}
	cfg, warnings, err := config.Parse(os.Args[1:], os.Getenv, config.WithVersion(version))
	switch {
	case errors.Is(err, config.ErrHelp), errors.Is(err, config.ErrVersion):
		return
	case err != nil:
		fmt.Fprintf(os.Stderr, "profi: invalid configuration:\n%v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	for _, w := range warnings {
		log.Warn(w)
	}
	if unsupported := cfg.Unsupported(); len(unsupported) > 0 {
		for _, u := range unsupported {
			log.Error(u)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("profi stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	started := time.Now()
	// Collect at +50 % of the live heap instead of Go's +100 %: the agent
	// makes little garbage (per drain and per scrape, never per event), so
	// this costs little CPU and keeps RSS down at many series
	// (docs/BENCHMARK.md, "Userspace cost vs series and call rate"). GOGC,
	// when set, still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	// Checked before BPF is loaded: bad credentials fail fast.
	httpSelf := collector.NewHTTP()
	metricsTLS, protect, err := metricsSecurity(cfg, httpSelf, log)
	if err != nil {
		return err
	}
	// The kernel against the known uprobe bugs (docs/KERNELS.md): a
	// degraded one is probed without return probes, which its bug turns
	// into process deaths; full kernel mode needs them at every launch.
	kernel := kbugs.Running()
	if cfg.AssumeKernel != "" {
		kernel.Release, kernel.Version, _ = strings.Cut(cfg.AssumeKernel, "|")
	}
	kr := kbugs.Classify(kernel)
	noReturn := kr.NoReturnProbes() && !cfg.AllowUnsafeKernel
	if noReturn && cfg.KernelMode == ops.KernelModeFull {
		log.Warn("--kernel-mode full needs return probes, which this kernel's known bug makes unsafe: anonymous instead", "kernel", kr.Summary())
		cfg.KernelMode = ops.KernelModeAnonymous
	}
	objs, err := bpfobj.Load(bpfobj.OptionsOf(cfg))
	if err != nil {
		return err
	}
	defer objs.Close()
	log.Info("BPF objects loaded", "kernel_mode", cfg.KernelMode, "pid_filter", cfg.PID, "uprobe_multi", objs.UprobeMulti)
	if objs.NoUprobeMulti != nil {
		log.Info("kernel without uprobe_multi links: probes use one classic uprobe per function", "err", objs.NoUprobeMulti)
	}

	self := collector.NewSelf()
	// --probe-traced-processes (docs/OPERATIONS.md, "Traced processes").
	excludeTraced := attach.ExcludesTraced(cfg.ProbeTracedProcesses, runtime.GOARCH)
	attacher := attach.New(attach.Options{
		MaxFilesPerPID: cfg.MaxAttachedFilesPerPID,
		MaxFiles:       cfg.MaxAttachedFiles,
		MaxDescriptors: attach.MaxDescriptors(cfg.MaxProbeDescriptors),
		MaxTeardown:    cfg.MaxTeardown,
		Programs:       objs.Programs(),
		KernelMode:     cfg.KernelMode,
		Profile:        cfg.ProbeProfile,
		PID:            cfg.PID,
		RetryBase:      cfg.RefreshInterval,
		RetryMax:       5 * time.Minute,
		Logger:         log,
		PIDFiles:       objs.PidFiles,
		RuntimeRanges:  true,
		FileFacts:      objs.FileFacts,
		RuntimeInodes:  objs.RtInodes,
		Handover:       attach.HandoverMaps{Sites: objs.RtSites, Ops: objs.RtOps, Counted: objs.RtCounted},
		Budget:         cfg.OverheadBudget > 0,
		UprobeMulti:    objs.UprobeMulti,
		NVTX:           cfg.EnableNVTX,
		ExcludeTraced:  excludeTraced,
		Inflight:       []*ebpf.Map{objs.Inflight, objs.NcclInflight},
		Tenant:         objs.Tenant,
		TenantOf:       tenant.Of(cfg.ProcPath),
		NoReturnProbes: noReturn,
	})
	features := status.KernelFeatures{UprobeMulti: objs.UprobeMulti, NoReturnProbes: noReturn}
	exitHook, err := attach.ExitHook(objs.ThreadExit)
	features.ExitHook = err == nil
	if err != nil {
		log.Warn("process-exit hook unavailable: in-flight NCCL calls of killed processes are cleared by the --gc-interval sweep instead", "err", err)
	} else {
		defer exitHook.Close()
	}
	attacher.AddStatic(discover.LibCudart, cfg.Cudart)
	// The breaker reports every stop: its own quarantines (only with
	// --crash-window and the exit hook) and the kernel-warning watch's.
	brk := breaker.New(breaker.Options{Lift: cfg.QuarantineLift, Files: attacher, Logger: log})
	crashes := cfg.CrashWindow > 0
	if crashes && !features.ExitHook {
		log.Error("crash circuit breaker off: it needs the process-exit hook")
		crashes = false
	}
	if crashes {
		// Without the evidence of each fault no crash is attributed to a
		// probe: every fault death is counted, nothing quarantined.
		faultHook, err := attach.FaultHook(objs.FaultDeliver)
		if err != nil {
			log.Error("crash circuit breaker blind: no fault is attributed to a probe without the signal-delivery hook", "err", err)
		} else {
			defer faultHook.Close()
		}
	}
	// A kernel with a known uprobe bug gets no probes unless
	// --allow-unsafe-kernel (docs/KERNELS.md, Known uprobe bugs).
	switch {
	case kr.Verdict == kbugs.Bad && !cfg.AllowUnsafeKernel:
		brk.StopAll(breaker.ReasonUnsafeKernel, kr.Summary())
	case kr.Verdict == kbugs.Bad:
		log.Warn("the kernel has a known uprobe bug that can hurt a probed process; probing anyway (--allow-unsafe-kernel)", "kernel", kr.Summary())
	case kr.Verdict == kbugs.Degraded && noReturn:
		log.Warn("the kernel has a known uprobe bug in return probes: calls are not timed (no return probes), launches, NVTX and ncclGroupStart still counted at entry (--allow-unsafe-kernel overrides)", "kernel", kr.Summary())
	case kr.Verdict == kbugs.Degraded:
		log.Warn("the kernel has a known uprobe bug in return probes; probing with them anyway (--allow-unsafe-kernel)", "kernel", kr.Summary())
	case kr.Verdict == kbugs.Suspect:
		log.Warn("the kernel may have a uprobe bug that can hurt a probed process, unless a backport fixed it; probing", "kernel", kr.Summary())
	}
	klog := kmsg.New(kmsg.Options{Logger: log, Fallback: kmsg.OpenSyslog})
	klog.Subscribe(kwatch.New(brk.StopAll, cfg.KmsgTrustUser).Consume)

	ctl, stopStats := startBudget(cfg, objs, attacher, log)
	defer stopStats()
	var scale func(int, ops.Op) float64
	var budgetStats func() *budget.Stats
	if ctl != nil {
		scale, budgetStats = ctl.Scale, ctl.Stats
	}

	pods, err := podWatch(cfg, log)
	if err != nil {
		return err
	}
	var podLabeler aggregate.PodLabeler
	var podStatus func() k8s.Status
	if pods != nil {
		enricher := &k8s.Enricher{Pods: pods, ProcRoot: cfg.ProcPath}
		podLabeler = enricher
		podStatus = pods.Status
		if !noReturn { // full mode needs return probes
			attacher.SetFullMode(enricher.FullMode) // profi/mode: full pods
		}
	}

	names := aggregate.NewNames(cfg.ProcPath, log)
	var events *aggregate.Events
	if cfg.DetailedLaunches {
		events = aggregate.NewEvents(log, func(d time.Duration) { self.EventDuration.Observe(d.Seconds()) })
	}
	var gpus *nvml.Poller
	var nvmlSnapshot func() *nvml.Snapshot // nil with --disable-nvml
	if !cfg.DisableNVML {
		if gpus, err = nvml.New(nvml.Options{
			Lib: nvml.NewLibrary(), Interval: cfg.NVMLInterval, Logger: log, GPM: cfg.GPM, GPMInterval: cfg.GPMInterval,
		}); err != nil {
			return fmt.Errorf("nvml: %w", err)
		}
		nvmlSnapshot = gpus.Snapshot
	}
	gpuLabeler := &gpu.Labeler{ProcRoot: cfg.ProcPath, NVML: nvmlSnapshot}
	agg := aggregate.New(aggregate.Options{
		Source:           aggregate.MapSource{Objects: objs},
		Procs:            aggregate.ProcFS{Root: cfg.ProcPath},
		Interval:         time.Second,
		GCInterval:       cfg.GCInterval,
		MaxTimeSeries:    cfg.MaxTimeSeries,
		MaxStreamsPerPID: cfg.MaxStreamsPerPID,
		MaxKernelsPerPID: cfg.MaxKernelsPerPID,
		NoKernels:        cfg.KernelMode == ops.KernelModeOff,
		Names:            names,
		Logger:           log,
		Observe:          func(d time.Duration) { self.DrainDuration.Observe(d.Seconds()) },
		Scale:            scale,
		NCCLHangTimeout:  cfg.NCCLHangTimeout,
		Pods:             podLabeler,
		GPUs:             gpuLabeler,
	})

	reg := prometheus.NewRegistry()
	data := collector.New(collector.Data{
		Snapshot:     agg.Snapshot,
		Attach:       attacher.Counters,
		Started:      started,
		NameFailures: names.Failures,
		LaunchEvents: launchEventsTotal(events),
		MapCapacity: map[string]uint32{
			"aggregated": objs.Aggregated.MaxEntries(),
			"launch_agg": objs.LaunchAgg.MaxEntries(),
		},
		Budget:      budgetStats,
		Kubernetes:  podStatus,
		GPURejected: gpuLabeler.Rejected,
		Node:        nodeLabel(cfg.NodeName),
	})
	reg.MustRegister(data)
	reg.MustRegister(self.Collectors()...)
	reg.MustRegister(httpSelf.Collectors()...)
	reg.MustRegister(brk, klog)
	// The kernel log's Xid lines (internal/xid), with NVML: their bus id
	// names the GPU. The one kernel-log reader feeds them too.
	var xids *xid.Tracker
	if gpus != nil {
		xids = xid.NewTracker(gpus.Snapshot, agg.Snapshot, xid.DefaultKeep)
		xids.TrustUser = cfg.KmsgTrustUser
		xids.KernelLogRunning = func() bool { return klog.Stats().Running }
		klog.Subscribe(xids.Consume)
		gpus.OnXid(xids.NVMLEvent)
		reg.MustRegister(collector.NewGPU(gpus.Snapshot, collector.WithProcesses(agg.Snapshot),
			collector.WithXids(xids.Counts, xids.Rejected, func() bool { return klog.Stats().Running })))
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// What /metrics and OTLP export: the registry and the per-process
	// families, which bypass it.
	exposition := collector.NewExposition(reg, data)
	pusher, err := otlpPusher(ctx, cfg, reg, exposition, started, log)
	if err != nil {
		return err
	}

	podCgroups := podCgroupScanner(cfg.ProcPath, objs, log)
	statusSrc := &collector.StatusSource{
		FileDescriptors: collector.FileDescriptors,
		Version:         version,
		Config:          cfg,
		Started:         started,
		Snapshot:        agg.Snapshot,
		Attach:          attacher.Status,
		Counters:        attacher.Counters,
		Features:        features,
		RecentLaunches:  recentLaunches(events),
		Kubernetes:      podStatus,
		NVML:            nvmlSnapshot,
		Quarantined:     brk.Status,
		KernelLog:       klog.Stats,
		Xids:            recentXids(xids),
		Tenant:          objs.Tenant,
		PodCgroups:      podCgroups.Status,
	}
	srv, err := server.Listen(server.Options{
		Listen:  cfg.Listen,
		Metrics: exposition,
		Status:  statusSrc.Document,
		// BPF is loaded before the server exists; with --node-name the pod
		// watch must have listed the node's pods. Never a library attached.
		Ready: func() bool { return pods == nil || pods.Synced() },
		// Healthy while drains are fresh and discovery passes arrive on
		// schedule, whatever --refresh-interval is.
		Heartbeat: server.Heartbeat(func() time.Time { return agg.Snapshot().Time }, attacher.LastPass, cfg.RefreshInterval),
		Encode:    func(d time.Duration) { self.EncodeDuration.Observe(d.Seconds()) },
		Logger:    log,
		TLS:       metricsTLS,
		Protect:   protect,
		// Limits: the defaults (docs/OPERATIONS.md "HTTP limits").
		LimitMetrics: server.LimitMetrics{Refused: httpSelf.Refused, Connections: httpSelf.Connections},
	})
	if err != nil {
		return err
	}

	g, ctx := errgroup.WithContext(ctx)
	if podCgroups != nil {
		g.Go(func() error { podCgroups.Run(ctx, tenant.ScanInterval); return nil })
	}
	passDue := make(chan struct{}, 1)
	g.Go(func() error {
		if err := attacher.WatchLoads(ctx, objs.LibLoads, cfg.ProcPath, passDue); err != nil {
			log.Warn("event-driven discovery unavailable; new libraries wait for the periodic rescan", "err", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := attacher.WatchLearning(ctx, objs.RtLearned); err != nil {
			log.Warn("runtime files learned between passes wait for the next pass to hand their launches to the driver", "err", err)
		}
		return nil
	})
	g.Go(func() error {
		return attacher.Run(ctx, attach.LoopOptions{
			Trigger:  passDue,
			Scanner:  &discover.Scanner{ProcRoot: cfg.ProcPath, PID: cfg.PID, NVTX: cfg.EnableNVTX, Tracers: excludeTraced},
			ProcRoot: cfg.ProcPath,
			Interval: cfg.RefreshInterval,
			Observe:  func(d time.Duration) { self.ScanDuration.Observe(d.Seconds()) },
		})
	})
	g.Go(func() error { return agg.Run(ctx) })
	if cfg.KernelLog == "off" {
		klog.Off("--kernel-log off")
		log.Info("kernel log off (--kernel-log off): kernel warnings in the uprobe code do not stop the probes, Xids come from NVML events only")
	} else {
		g.Go(func() error {
			if err := klog.Run(ctx); err != nil {
				log.Error("kernel log unreadable: kernel warnings in the uprobe code no longer stop the probes, Xids come from NVML events only", "err", err)
			}
			return nil
		})
	}
	if crashes {
		g.Go(func() error {
			if err := brk.Run(ctx, objs.CrashEvents, objs.CrashLost); err != nil {
				log.Error("crash circuit breaker stopped: probed processes that crash are no longer noticed", "err", err)
			}
			return nil
		})
	}
	if pods != nil {
		g.Go(func() error { return pods.Run(ctx) })
	}
	if gpus != nil {
		g.Go(func() error { return gpus.Run(ctx) })
	}
	if ctl != nil {
		g.Go(func() error { return ctl.Run(ctx) })
	}
	// The ring consumers are extras: if one cannot start, the agent keeps
	// counting without it.
	g.Go(func() error {
		if err := names.Run(ctx, objs); err != nil {
			log.Warn("kernel names unavailable; launches keep unknown_0x... labels", "err", err)
		}
		return nil
	})
	if events != nil {
		g.Go(func() error {
			if err := events.Run(ctx, objs.Events); err != nil {
				log.Warn("detailed launch events unavailable", "err", err)
			}
			return nil
		})
	}
	g.Go(func() error { return srv.Run(ctx) })
	if pusher != nil {
		g.Go(func() error { return pusher.Run(ctx) })
	}
	if cfg.ReportInterval > 0 {
		g.Go(func() error { return collector.Report(ctx, os.Stdout, agg.Snapshot, cfg.ReportInterval) })
	}
	err = g.Wait()
	log.Info("profi stopped")
	return err
}

// podWatch prepares the pod watch of --node-name: in-cluster credentials,
// or the kubeconfig file named by KUBECONFIG (outside a cluster, tests).
// An API server that is down is not an error here: the watch retries and
// reports it; credentials that cannot exist are.
func podWatch(cfg *config.Config, log *slog.Logger) (*k8s.Watcher, error) {
	if cfg.NodeName == "" {
		return nil, nil
	}
	rc, err := kubeConfig()
	if err != nil {
		return nil, fmt.Errorf("pod enrichment (--node-name %s) needs in-cluster credentials or KUBECONFIG: %w", cfg.NodeName, err)
	}
	client, err := k8s.NewClient(rc)
	if err != nil {
		return nil, err
	}
	return k8s.NewWatcher(client.Pods(cfg.NodeName), cfg.NodeName, log)
}

// startBudget prepares --overhead-budget: BPF run-time statistics and a
// calibrated trap cost. Without them it logs why and returns nil: the
// agent then profiles every call, as with the budget off.
func startBudget(cfg *config.Config, objs *bpfobj.Objects, attacher *attach.Attacher, log *slog.Logger) (ctl *budget.Controller, stop func()) {
	stop = func() {}
	if cfg.OverheadBudget <= 0 {
		return nil, stop
	}
	// Statistics run while the returned fd is open: the caller closes it
	// when the agent stops (dropped, the GC would close it and stop them).
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		log.Warn("overhead budget off: BPF run-time statistics unavailable", "err", err)
		return nil, stop
	}
	stop = func() { _ = stats.Close() }
	trap, err := budget.Calibrate()
	if err != nil {
		log.Warn("overhead budget off: trap cost calibration failed", "err", err)
		return nil, stop
	}
	log.Info("overhead budget on", "budget_percent", cfg.OverheadBudget*100, "trap_cost", trap)
	return budget.New(budget.Options{
		Budget:   cfg.OverheadBudget,
		TrapCost: trap,
		Files:    attacher,
		Sources: budget.MapSources{
			PIDHits:  objs.PidHits,
			Programs: objs.Programs(),
			ProcRoot: cfg.ProcPath,
		},
		Logger: log,
	}), stop
}

// otlpPusher prepares the OTLP push (nil when no endpoint is set): it
// converts what g gathers, the same data /metrics serves, and registers
// its self-metrics on reg (part of g).
func otlpPusher(ctx context.Context, cfg *config.Config, reg *prometheus.Registry, g prometheus.Gatherer, started time.Time, log *slog.Logger) (*otlp.Pusher, error) {
	if !cfg.OTLP.Enabled() {
		return nil, nil
	}
	exp, err := otlp.NewExporter(ctx, cfg.OTLP)
	if err != nil {
		return nil, err
	}
	m := otlp.NewMetrics()
	reg.MustRegister(m.Collectors()...)
	conv := otlp.NewConverter(g, otlp.Resource(cfg.OTLP, version, cfg.NodeName, os.Getenv), version, started)
	log.Info("OTLP push on", "endpoint", cfg.OTLP.Endpoint, "protocol", cfg.OTLP.Protocol, "interval", cfg.OTLP.Interval, "tls", cfg.OTLP.UseTLS())
	return otlp.NewPusher(conv, exp, cfg.OTLP.Interval, cfg.OTLP.Timeout, m, log), nil
}

func recentLaunches(e *aggregate.Events) func() []aggregate.LaunchEvent {
	if e == nil {
		return nil
	}
	return e.Recent
}

func launchEventsTotal(e *aggregate.Events) func() uint64 {
	if e == nil {
		return nil
	}
	return e.Total
}

// recentXids is the /status source of the Xids; nil without NVML.
func recentXids(t *xid.Tracker) func() []status.Xid {
	if t == nil {
		return nil
	}
	return t.Recent
}

// nodeLabel is the node of the NCCL rank families: --node-name, else the
// kernel's host name (the node's, in the chart's host network).
func nodeLabel(nodeName string) string {
	if nodeName != "" {
		return nodeName
	}
	host, _ := os.Hostname()
	return host
}

// podCgroupScanner scans for the node's pod cgroups once, before the first
// discovery pass, so that the processes of a running pod are one tenant
// from their first key (internal/tenant); nil where the host's cgroup v2
// hierarchy cannot be found (every cgroup is then a tenant of its own).
func podCgroupScanner(procPath string, objs *bpfobj.Objects, log *slog.Logger) *tenant.Scanner {
	dir, err := tenant.FindDir(procPath)
	if err != nil {
		log.Info("no pod cgroups: every cgroup is a tenant of its own", "err", err)
		return nil
	}
	s := &tenant.Scanner{Dir: dir, Roots: tenant.MapRoots{Map: objs.TenantRoots}, Log: log}
	if n, _, err := s.Scan(); err != nil {
		log.Warn("pod cgroups: first scan failed; retrying", "dir", dir, "err", err)
	} else {
		log.Info("pod cgroups", "dir", dir, "pods", n)
	}
	return s
}
