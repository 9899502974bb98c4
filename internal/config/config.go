package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/profi-dev/profi/internal/ops"
)

// OTLP transports. Parse normalises the four accepted --otlp-protocol spellings to these two.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// /metrics TLS modes (--metrics-tls-mode), docs/INTERFACE.md 2.5.
const (
	TLSModeOff    = "off"
	TLSModeServer = "server"
	TLSModeMTLS   = "mtls"
)

// /metrics authentication modes (--metrics-auth-mode), docs/INTERFACE.md 2.5.
const (
	AuthModeOff          = "off"
	AuthModeBearer       = "bearer"
	AuthModeMTLSOrBearer = "mtls-or-bearer"
)

// Environment variables read besides the ones in the flag tags.
const (
	envRustLog = "RUST_LOG"

	envOTLPEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envOTLPMetricsEndpoint = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
	envOTLPProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envOTLPMetricsProtocol = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
	envOTLPInterval        = "OTEL_METRIC_EXPORT_INTERVAL"
	envOTLPTimeout         = "OTEL_EXPORTER_OTLP_TIMEOUT"
	envOTLPMetricsTimeout  = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"
	envOTLPServiceName     = "OTEL_SERVICE_NAME"
	envOTLPHeaders         = "OTEL_EXPORTER_OTLP_HEADERS"
	envOTLPMetricsHeaders  = "OTEL_EXPORTER_OTLP_METRICS_HEADERS"
	envOTLPCACert          = "OTEL_EXPORTER_OTLP_CERTIFICATE"
	envOTLPMetricsCACert   = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"
	envOTLPClientCert      = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
	envOTLPMetricsClient   = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE"
	envOTLPClientKey       = "OTEL_EXPORTER_OTLP_CLIENT_KEY"
	envOTLPMetricsKey      = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"
	envOTLPInsecure        = "OTEL_EXPORTER_OTLP_INSECURE"
	envOTLPMetricsInsecure = "OTEL_EXPORTER_OTLP_METRICS_INSECURE"
	envOTLPResourceAttrs   = "OTEL_RESOURCE_ATTRIBUTES"
)

const (
	// maxSeconds bounds every seconds value so that converting it to a time.Duration cannot
	// overflow (2^31 s is about 68 years, far below Duration's 292 years).
	maxSeconds = math.MaxInt32
	// maxMapEntries bounds the BPF map sizes: beyond this the kernel would pin gigabytes of memory,
	// which is a typo rather than a setting.
	maxMapEntries = 1 << 24
	// metricsPath is appended to a generic http/protobuf endpoint (OTLP specification).
	metricsPath = "/v1/metrics"
)

// ErrHelp is returned by Parse after --help printed the usage. Exit with status 0.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by Parse after --version printed the version. Exit with status 0.
var ErrVersion = errors.New("version requested")

// Config is the validated agent configuration. Durations given in seconds on the command line are
// already converted.
type Config struct {
	Listen                 string        // --listen
	ProcPath               string        // --proc-path
	KernelMode             string        // --kernel-mode: off|anonymous|full
	ProbeProfile           string        // --probe-profile: lean|full
	Cudart                 string        // --cudart
	PID                    int           // --pid / -p; 0 = all processes
	NodeName               string        // --node-name, env NODE_NAME
	RefreshInterval        time.Duration // --refresh-interval
	GCInterval             time.Duration // --gc-interval
	ReportInterval         time.Duration // --report-interval; 0 = off
	EnableNVTX             bool          // --enable-nvtx-tracing
	DisableNVML            bool          // --disable-nvml
	NVMLInterval           time.Duration // --nvml-interval
	GPM                    string        // --gpm: auto|on|off
	GPMInterval            time.Duration // --gpm-interval
	NCCLHangTimeout        time.Duration // --nccl-hang-timeout; 0 = hang detection off
	MaxTimeSeries          int           // --max-time-series
	MaxStreamsPerPID       int           // --max-streams-per-pid
	MaxKernelsPerPID       int           // --max-kernels-per-pid
	MaxAttachedFilesPerPID int           // --max-attached-files-per-pid
	MaxAttachedFiles       int           // --max-attached-files: node-wide
	MaxProbeDescriptors    int           // --max-probe-descriptors; 0 = three quarters of the agent's descriptor limit
	MaxTeardown            time.Duration // --max-teardown; 0 = no cap
	SampleRate             int           // --sample-rate; 1 = no sampling
	EntriesSize            uint32        // --entries-size
	AggregatedSize         uint32        // --aggregated-size
	LaunchAggSize          uint32        // --launch-agg-size
	MallocSizesSize        uint32        // --malloc-sizes-size
	DetailedLaunches       bool          // --detailed-launches
	OverheadBudget         float64       // --overhead-budget as a fraction (1 % = 0.01); 0 = off
	CrashWindow            time.Duration // --crash-window; 0 = crash circuit breaker off, any other value on
	QuarantineLift         time.Duration // --quarantine-lift; doubled at each quarantine of a file; 0 = until restart
	NoUprobeMulti          bool          // hidden --no-uprobe-multi: classic uprobes for CUDA and NCCL (tests the fallback)
	AllowUnsafeKernel      bool          // --allow-unsafe-kernel: attach probes on a kernel with a known uprobe bug
	ProbeTracedProcesses   string        // --probe-traced-processes: auto|always|never
	KernelLog              string        // --kernel-log: auto|off
	KmsgTrustUser          bool          // hidden --kmsg-trust-user: kernel-log lines written from userspace count as the kernel's (tests)
	AssumeKernel           string        // hidden --assume-kernel "RELEASE|VERSION": the kernel the bug table classifies (tests)
	LogLevel               slog.Level    // --log-level / PROFI_LOG_LEVEL, else RUST_LOG, else info
	OTLP                   OTLPConfig    // --otlp-* and OTEL_* (docs/INTERFACE.md 2.4)
	MetricsTLS             TLSConfig     // --metrics-tls-* (docs/INTERFACE.md 2.5)
	MetricsAuth            AuthConfig    // --metrics-auth-* (docs/INTERFACE.md 2.5)
}

// OTLPConfig holds the OTLP push settings after the precedence rules of docs/INTERFACE.md 2.4.
type OTLPConfig struct {
	// Endpoint is the final URL to push to; empty means OTLP push is off. For http/protobuf a
	// generic base endpoint already has /v1/metrics appended.
	Endpoint string
	// SignalSpecific is true when Endpoint came from OTEL_EXPORTER_OTLP_METRICS_ENDPOINT and is
	// used exactly as given.
	SignalSpecific bool
	// Protocol is ProtocolGRPC or ProtocolHTTPProtobuf.
	Protocol    string
	Interval    time.Duration
	Timeout     time.Duration
	ServiceName string
	// Headers are sent as gRPC metadata or HTTP headers.
	Headers map[string]string
	// CACert, ClientCert and ClientKey are PEM file paths; empty means unset.
	CACert     string
	ClientCert string
	ClientKey  string
	// Insecure forces plain-text transport even if TLS material is set.
	Insecure bool
	// ResourceAttrs are merged last, over the default resource attributes.
	ResourceAttrs map[string]string
}

// Enabled reports whether OTLP push is configured.
func (o OTLPConfig) Enabled() bool { return o.Endpoint != "" }

// UseTLS reports whether the exporter must use TLS, for gRPC and HTTP alike: not insecure, and
// either an https:// endpoint or TLS material (CA or client certificate) is set.
func (o OTLPConfig) UseTLS() bool {
	if o.Insecure {
		return false
	}
	return strings.HasPrefix(strings.ToLower(o.Endpoint), "https://") || o.CACert != "" || o.ClientCert != ""
}

// TLSConfig configures TLS on the /metrics listener.
type TLSConfig struct {
	Mode         string // TLSModeOff, TLSModeServer or TLSModeMTLS
	CertFile     string
	KeyFile      string
	ClientCAFile string
	// AllowedClientSANs, when not empty, restricts the client
	// certificates that authenticate to those with one of these SANs
	// (Addition: --metrics-tls-allowed-client-sans).
	AllowedClientSANs []string
}

// AuthConfig configures authentication of /metrics and /status.
type AuthConfig struct {
	Mode      string // AuthModeOff, AuthModeBearer or AuthModeMTLSOrBearer
	Audience  string // empty = no audience check
	CacheTTL  time.Duration
	CacheSize int
	// Authorize checks each bearer-authenticated request with a
	// SubjectAccessReview (Addition: --metrics-auth-authorize).
	Authorize bool
}

// Option changes how Parse prints help and version.
type Option func(*settings)

type settings struct {
	out     io.Writer
	version string
}

// WithOutput sets where --help and --version print (default os.Stdout).
func WithOutput(w io.Writer) Option { return func(s *settings) { s.out = w } }

// WithVersion sets the string --version prints (default "dev").
func WithVersion(v string) Option { return func(s *settings) { s.version = v } }

// cli is the kong grammar. Seconds are plain ints and map sizes int64 so that out-of-range values
// reach our validation (which reports everything at once) instead of failing in kong's mappers.
// The env tags are resolved through Parse's getenv, never from the process environment. The OTLP
// flags carry no env tag because their variables follow the special rules in resolveOTLP.
type cli struct {
	Help    helpFlag    `name:"help" short:"h" help:"Show this help and exit."`
	Version versionFlag `name:"version" short:"V" help:"Print the version and exit."`

	Listen                 string  `name:"listen" default:"0.0.0.0:9401" placeholder:"ADDR" help:"Listen address for /metrics, /health, /ready, /status."`
	ProcPath               string  `name:"proc-path" default:"/proc" placeholder:"PATH" help:"Root of procfs (in a container: the host's, e.g. /host/proc)."`
	KernelMode             string  `name:"kernel-mode" default:"anonymous" placeholder:"MODE" help:"Kernel launch tracing: off, anonymous or full."`
	ProbeProfile           string  `name:"probe-profile" default:"lean" placeholder:"PROFILE" help:"Probe set: lean or full."`
	Cudart                 string  `name:"cudart" default:"/usr/local/cuda/lib64/libcudart.so" placeholder:"PATH" help:"libcudart attached at startup, in the agent's own mount namespace."`
	PID                    int     `name:"pid" short:"p" default:"0" placeholder:"PID" help:"Attach only to this host PID; 0 means all processes."`
	NodeName               string  `name:"node-name" env:"NODE_NAME" placeholder:"NAME" help:"Kubernetes node name; turns on pod enrichment."`
	RefreshInterval        int     `name:"refresh-interval" default:"10" placeholder:"SECS" help:"Period of the /proc discovery rescan, in seconds."`
	GCInterval             int     `name:"gc-interval" default:"60" placeholder:"SECS" help:"Period of the cleanup pass, in seconds."`
	ReportInterval         int     `name:"report-interval" default:"0" placeholder:"SECS" help:"Print a throughput table every N seconds; 0 means off."`
	EnableNVTX             bool    `name:"enable-nvtx-tracing" help:"Also probe NVTX range push/pop to fill the phase label."`
	DisableNVML            bool    `name:"disable-nvml" help:"Do not start the NVML poller."`
	NVMLInterval           int     `name:"nvml-interval" default:"5" placeholder:"SECS" help:"NVML poll period, in seconds."`
	GPM                    string  `name:"gpm" default:"auto" placeholder:"MODE" help:"NVML GPM (Hopper and newer) metrics: auto (where supported), on (also warn where not), off."`
	GPMInterval            int     `name:"gpm-interval" default:"5" placeholder:"SECS" help:"Window of each GPM value, in seconds (sampled at the first NVML poll at or after it is due)."`
	NCCLHangTimeout        int     `name:"nccl-hang-timeout" default:"60" placeholder:"SECS" help:"Age in seconds after which an in-flight NCCL call counts as hung; 0 disables."`
	MaxTimeSeries          int     `name:"max-time-series" default:"50000" placeholder:"N" help:"Global cap on exported label tuples."`
	MaxStreamsPerPID       int     `name:"max-streams-per-pid" default:"32" placeholder:"N" help:"Per-PID cap on distinct stream values."`
	MaxKernelsPerPID       int     `name:"max-kernels-per-pid" default:"512" placeholder:"N" help:"Per-PID cap on distinct kernels."`
	MaxAttachedFilesPerPID int     `name:"max-attached-files-per-pid" default:"64" placeholder:"N" help:"A new library file is not attached when every process mapping it has N attached (or retried) files already."`
	MaxAttachedFiles       int     `name:"max-attached-files" default:"1024" placeholder:"N" help:"Node-wide cap on library files attached (or retried)."`
	MaxProbeDescriptors    int     `name:"max-probe-descriptors" default:"0" placeholder:"N" help:"Cap on the file descriptors the probes' links hold, every file, traced process and full-mode upgrade; a new file or per-process link set past it is not linked. 0: three quarters of the agent's descriptor limit (RLIMIT_NOFILE)."`
	MaxTeardown            int     `name:"max-teardown" default:"0" placeholder:"SECS" help:"Cap on the estimated time to release every probe link at exit (one classic uprobe takes tens of milliseconds to go, one after the other), so that the agent stops within its termination grace period; a new file or per-process link set past it is not linked. 0: no cap (the chart sets it from terminationGracePeriodSeconds)."`
	SampleRate             int     `name:"sample-rate" default:"1" placeholder:"N" help:"Measure the duration of one call in N; 1 means no sampling."`
	EntriesSize            int64   `name:"entries-size" default:"10240" placeholder:"N" help:"max_entries of the in-flight BPF map."`
	AggregatedSize         int64   `name:"aggregated-size" default:"2048" placeholder:"N" help:"max_entries of the CUDA aggregation BPF map."`
	LaunchAggSize          int64   `name:"launch-agg-size" default:"8192" placeholder:"N" help:"max_entries of the kernel-launch aggregation BPF map."`
	MallocSizesSize        int64   `name:"malloc-sizes-size" default:"131072" placeholder:"N" help:"max_entries of the live-allocation BPF map."`
	DetailedLaunches       bool    `name:"detailed-launches" help:"Also send one ring-buffer event per kernel launch (debugging)."`
	NoUprobeMulti          bool    `name:"no-uprobe-multi" hidden:"" help:"Attach CUDA and NCCL with classic uprobes even where uprobe_multi exists (tests the fallback of older kernels)."`
	ProbeTracedProcesses   string  `name:"probe-traced-processes" default:"auto" placeholder:"POLICY" help:"Whether a process with a tracer (gdb, strace, CRIU: TracerPid in /proc/PID/status) is probed: always, never, or auto (never on arm64, whose kernel's uprobe single-step handler misbehaved for traced processes; always elsewhere). An unprobed process has no breakpoint in its memory; it is probed again when its tracer leaves."`
	AllowUnsafeKernel      bool    `name:"allow-unsafe-kernel" help:"Attach probes even on a kernel with a known uprobe bug that can hurt a probed process (docs/KERNELS.md, Known uprobe bugs); without it such a kernel gets no probes."`
	KernelLog              string  `name:"kernel-log" default:"auto" placeholder:"MODE" help:"Whether the agent follows the kernel log (kernel warnings in the uprobe code stop every probe; Xid lines): auto (/dev/kmsg, or syslog(2) with CAP_SYSLOG where the device cannot be opened, as in a container) or off."`
	AssumeKernel           string  `name:"assume-kernel" hidden:"" help:"Classify this kernel (uname -r and -v, joined by |) against the known uprobe bugs instead of the running one (tests of the refusal and downgrade paths)."`
	KmsgTrustUser          bool    `name:"kmsg-trust-user" hidden:"" help:"Let kernel-log lines written from userspace count as the kernel's own (tests write their kernel warnings; never in production: any root process could stop the probes)."`
	OverheadBudget         float64 `name:"overhead-budget" env:"PROFI_OVERHEAD_BUDGET" default:"0" placeholder:"PERCENT" help:"Most CPU time, in percent of a traced process's own, that its probes may cost; above it hot probes are duty-cycled and their counts become estimates. 0 means off."`
	CrashWindow            int     `name:"crash-window" default:"5" placeholder:"SECS" help:"0 turns the crash circuit breaker off; any other value turns it on. The breaker acts on evidence, not time: a probed process killed by a fault the kernel raised in the probes (the uprobe page, a probed instruction, a return probe's return) quarantines that library file for its tenant, one in a second tenant node-wide."`
	QuarantineLift         int     `name:"quarantine-lift" default:"600" placeholder:"SECS" help:"Seconds after which a quarantined library is probed again, doubled each time the same file is quarantined again; 0 means not before the agent restarts (pinned)."`
	LogLevel               string  `name:"log-level" env:"PROFI_LOG_LEVEL" placeholder:"LEVEL" help:"error, warn, info, debug or trace; wins over RUST_LOG."`

	OTLPEndpoint      string `name:"otlp-endpoint" group:"otlp" placeholder:"URL" help:"Collector endpoint; empty means off. Env: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (used as given), OTEL_EXPORTER_OTLP_ENDPOINT."`
	OTLPProtocol      string `name:"otlp-protocol" group:"otlp" default:"grpc" placeholder:"PROTO" help:"grpc, grpc/protobuf, http/protobuf or http. Env: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL."`
	OTLPIntervalSecs  int    `name:"otlp-interval-secs" group:"otlp" default:"60" placeholder:"SECS" help:"Push period in seconds. Env: OTEL_METRIC_EXPORT_INTERVAL (milliseconds)."`
	OTLPTimeoutSecs   int    `name:"otlp-timeout-secs" group:"otlp" default:"10" placeholder:"SECS" help:"Per-push timeout in seconds. Env: OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds)."`
	OTLPServiceName   string `name:"otlp-service-name" group:"otlp" default:"profi" placeholder:"NAME" help:"Resource service.name. Env: OTEL_SERVICE_NAME."`
	OTLPHeaders       string `name:"otlp-headers" group:"otlp" placeholder:"K=V,..." help:"Headers sent with each push. Env: OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_HEADERS."`
	OTLPCACert        string `name:"otlp-ca-cert" group:"otlp" placeholder:"PATH" help:"CA bundle (PEM) to verify the collector. Env: OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE, OTEL_EXPORTER_OTLP_CERTIFICATE."`
	OTLPClientCert    string `name:"otlp-client-cert" group:"otlp" placeholder:"PATH" help:"Client certificate (PEM). Env: OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE."`
	OTLPClientKey     string `name:"otlp-client-key" group:"otlp" placeholder:"PATH" help:"Client key (PEM). Env: OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY, OTEL_EXPORTER_OTLP_CLIENT_KEY."`
	OTLPInsecure      bool   `name:"otlp-insecure" group:"otlp" help:"Plain-text transport even if TLS material is set. Env: OTEL_EXPORTER_OTLP_METRICS_INSECURE, OTEL_EXPORTER_OTLP_INSECURE."`
	OTLPResourceAttrs string `name:"otlp-resource-attrs" group:"otlp" placeholder:"K=V,..." help:"Resource attributes, merged last. Env: OTEL_RESOURCE_ATTRIBUTES."`

	MetricsTLSMode       string `name:"metrics-tls-mode" group:"metrics" env:"PROFI_METRICS_TLS_MODE" default:"off" placeholder:"MODE" help:"off, server or mtls."`
	MetricsTLSCert       string `name:"metrics-tls-cert" group:"metrics" env:"PROFI_METRICS_TLS_CERT" placeholder:"PATH" help:"Server certificate chain (PEM)."`
	MetricsTLSKey        string `name:"metrics-tls-key" group:"metrics" env:"PROFI_METRICS_TLS_KEY" placeholder:"PATH" help:"Server private key (PEM)."`
	MetricsTLSClientCA   string `name:"metrics-tls-client-ca" group:"metrics" env:"PROFI_METRICS_TLS_CLIENT_CA" placeholder:"PATH" help:"CA bundle for client certificates (mtls)."`
	MetricsTLSClientSANs string `name:"metrics-tls-allowed-client-sans" group:"metrics" env:"PROFI_METRICS_TLS_ALLOWED_CLIENT_SANS" placeholder:"SAN,..." help:"Comma-separated SANs (DNS name, URI, e-mail or IP) of which a client certificate must carry one (mtls); empty: any certificate of the client CA."`
	MetricsAuthMode      string `name:"metrics-auth-mode" group:"metrics" env:"PROFI_METRICS_AUTH_MODE" default:"off" placeholder:"MODE" help:"off, bearer or mtls-or-bearer."`
	MetricsAuthAudience  string `name:"metrics-auth-audience" group:"metrics" env:"PROFI_METRICS_AUTH_AUDIENCE" placeholder:"AUD" help:"Audience the TokenReview must include."`
	MetricsAuthCacheTTL  int    `name:"metrics-auth-cache-ttl" group:"metrics" env:"PROFI_METRICS_AUTH_CACHE_TTL" default:"60" placeholder:"SECS" help:"Seconds a successful TokenReview is cached."`
	MetricsAuthCacheSize int    `name:"metrics-auth-cache-size" group:"metrics" env:"PROFI_METRICS_AUTH_CACHE_SIZE" default:"1024" placeholder:"N" help:"Capacity of the TokenReview cache."`
	MetricsAuthAuthorize bool   `name:"metrics-auth-authorize" group:"metrics" env:"PROFI_METRICS_AUTH_AUTHORIZE" help:"Authorize bearer tokens with a SubjectAccessReview (non-resource URL, verb get), as kube-rbac-proxy does."`
}

// helpFlag replaces kong's help flag, which would call os.Exit.
type helpFlag bool

// BeforeReset runs before defaults and env are applied, so help works whatever else is set.
func (helpFlag) BeforeReset(ctx *kong.Context) error {
	if err := ctx.PrintUsage(false); err != nil {
		return fmt.Errorf("print help: %w", err)
	}
	return ErrHelp
}

// versionFlag replaces kong.VersionFlag, which would call os.Exit.
type versionFlag bool

// BeforeReset prints the version given with WithVersion.
func (versionFlag) BeforeReset(k *kong.Kong, vars kong.Vars) error {
	if _, err := fmt.Fprintln(k.Stdout, vars["version"]); err != nil {
		return fmt.Errorf("print version: %w", err)
	}
	return ErrVersion
}

// parser carries the state of one Parse call.
type parser struct {
	getenv  func(string) string
	envs    map[string][]string // flag name -> env vars from its env tag
	fromEnv map[string]string   // flag name -> env var its value came from
	onCLI   map[string]bool     // flags given on the command line
	errs    []error
	warns   []string
}

func (p *parser) errorf(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf(format, args...))
}

func (p *parser) warnf(format string, args ...any) {
	p.warns = append(p.warns, fmt.Sprintf(format, args...))
}

// env returns the trimmed value of an environment variable; blank counts as unset.
func (p *parser) env(name string) string { return strings.TrimSpace(p.getenv(name)) }

// source names where a flag's value came from, for error messages.
func (p *parser) source(flag string) string {
	if e, ok := p.fromEnv[flag]; ok {
		return e
	}
	return "--" + flag
}

// newKong builds the kong parser. It strips the env tags from the model so that kong never reads
// the process environment; the envResolver reads them through getenv instead, which also gives
// the command line precedence over env (kong only asks resolvers about flags not given).
func newKong(grammar *cli, p *parser, s *settings) (*kong.Kong, error) {
	k, err := kong.New(grammar,
		kong.Name("profi"),
		kong.Description("profi exports CUDA, NCCL and GPU metrics of the processes on this node, traced with eBPF uprobes. "+
			"Operator commands: profi check (preflight), profi explain PID|POD, profi top (each takes --help)."),
		kong.NoDefaultHelp(),
		kong.Exit(func(int) {}), // never exit the process; help and version return sentinels
		kong.Writers(s.out, s.out),
		kong.Vars{"version": s.version},
		kong.ExplicitGroups([]kong.Group{
			{Key: "otlp", Title: "OTLP push (docs/INTERFACE.md 2.4; flags win over OTEL_* env vars):"},
			{Key: "metrics", Title: "/metrics TLS and authentication:"},
		}),
		kong.ValueFormatter(p.formatHelp),
		kong.Resolvers(kong.ResolverFunc(p.resolveEnv)),
	)
	if err != nil {
		return nil, fmt.Errorf("build flag parser: %w", err)
	}
	for _, f := range k.Model.Flags {
		if len(f.Tag.Envs) > 0 {
			p.envs[f.Name] = f.Tag.Envs
			f.Tag.Envs, f.Envs = nil, nil
		}
	}
	return k, nil
}

// resolveEnv is the kong resolver for flags with an env tag that were not given on the command
// line. An unparsable number is recorded (so it is reported with every other problem) and the
// default is kept.
func (p *parser) resolveEnv(_ *kong.Context, _ *kong.Path, f *kong.Flag) (any, error) {
	for _, name := range p.envs[f.Name] {
		v := p.env(name)
		if v == "" {
			continue
		}
		switch f.Target.Kind() {
		case reflect.Int, reflect.Int64:
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				p.errorf("%s: %q is not an integer", name, v)
				return nil, nil
			}
		}
		p.fromEnv[f.Name] = name
		return v, nil
	}
	return nil, nil
}

// formatHelp adds the default and the env vars to each flag's help line.
func (p *parser) formatHelp(v *kong.Value) string {
	var extra []string
	if v.HasDefault && v.Default != "" {
		extra = append(extra, "default: "+v.Default)
	}
	if envs := p.envs[v.Name]; len(envs) > 0 {
		extra = append(extra, "env: "+strings.Join(envs, ", "))
	}
	if len(extra) == 0 {
		return v.Help
	}
	return v.Help + " (" + strings.Join(extra, "; ") + ")"
}

func newParser(getenv func(string) string) *parser {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	return &parser{
		getenv:  getenv,
		envs:    map[string][]string{},
		fromEnv: map[string]string{},
		onCLI:   map[string]bool{},
	}
}

func newSettings(opts []Option) *settings {
	s := &settings{out: os.Stdout, version: "dev"}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Parse parses args (without argv[0]), looking environment variables up through getenv (nil means
// an empty environment). It returns the config, warnings to log (ignored settings, dropped header
// pairs), and every problem found joined into one error. --help and --version print to the
// WithOutput writer and return ErrHelp or ErrVersion with a nil Config. Parse never exits.
func Parse(args []string, getenv func(string) string, opts ...Option) (*Config, []string, error) {
	p := newParser(getenv)
	var raw cli
	k, err := newKong(&raw, p, newSettings(opts))
	if err != nil {
		return nil, nil, err
	}
	ctx, err := k.Parse(args)
	switch {
	case errors.Is(err, ErrHelp):
		return nil, nil, ErrHelp
	case errors.Is(err, ErrVersion):
		return nil, nil, ErrVersion
	case err != nil:
		// Syntax errors (unknown flag, non-integer value) stop kong at the first one; env problems
		// recorded so far are reported with it.
		return nil, nil, errors.Join(append(p.errs, fmt.Errorf("parse command line: %w", err))...)
	}
	for _, path := range ctx.Path {
		if path.Flag != nil && !path.Resolved {
			p.onCLI[path.Flag.Name] = true
		}
	}

	cfg := p.build(&raw)
	if len(p.errs) > 0 {
		return nil, p.warns, errors.Join(p.errs...)
	}
	return cfg, p.warns, nil
}

// Default returns the configuration with every default and no environment, for tests and tools.
func Default() *Config {
	cfg, _, err := Parse(nil, nil)
	if err != nil {
		panic(fmt.Sprintf("config: defaults do not validate: %v", err)) // a bug in the tags above
	}
	return cfg
}

// Usage writes the help text to w, as --help does.
func Usage(w io.Writer) error {
	p := newParser(nil)
	var raw cli
	k, err := newKong(&raw, p, newSettings([]Option{WithOutput(w)}))
	if err != nil {
		return err
	}
	ctx, err := kong.Trace(k, nil)
	if err != nil {
		return fmt.Errorf("print help: %w", err)
	}
	if err := ctx.PrintUsage(false); err != nil {
		return fmt.Errorf("print help: %w", err)
	}
	return nil
}

// build converts and validates the raw flags, recording every problem in p.
func (p *parser) build(raw *cli) *Config {
	cfg := &Config{
		Listen:                 raw.Listen,
		ProcPath:               raw.ProcPath,
		KernelMode:             raw.KernelMode,
		ProbeProfile:           raw.ProbeProfile,
		Cudart:                 raw.Cudart,
		PID:                    raw.PID,
		NodeName:               strings.TrimSpace(raw.NodeName),
		EnableNVTX:             raw.EnableNVTX,
		DisableNVML:            raw.DisableNVML,
		MaxTimeSeries:          raw.MaxTimeSeries,
		MaxStreamsPerPID:       raw.MaxStreamsPerPID,
		MaxKernelsPerPID:       raw.MaxKernelsPerPID,
		MaxAttachedFilesPerPID: raw.MaxAttachedFilesPerPID,
		MaxAttachedFiles:       raw.MaxAttachedFiles,
		MaxProbeDescriptors:    raw.MaxProbeDescriptors,
		SampleRate:             raw.SampleRate,
		DetailedLaunches:       raw.DetailedLaunches,
		NoUprobeMulti:          raw.NoUprobeMulti,
		KernelLog:              raw.KernelLog,
		KmsgTrustUser:          raw.KmsgTrustUser,
		AssumeKernel:           raw.AssumeKernel,
		AllowUnsafeKernel:      raw.AllowUnsafeKernel,
		ProbeTracedProcesses:   raw.ProbeTracedProcesses,
	}

	p.checkListen(raw.Listen)
	// The values are the operation table's (docs/INTERFACE.md 2.2, 2.3).
	p.checkEnum("kernel-mode", raw.KernelMode, ops.KernelModeOff, ops.KernelModeAnonymous, ops.KernelModeFull)
	p.checkEnum("probe-profile", raw.ProbeProfile, ops.ProfileLean, ops.ProfileFull)
	p.checkEnum("gpm", raw.GPM, "auto", "on", "off")
	p.checkEnum("probe-traced-processes", raw.ProbeTracedProcesses, "auto", "always", "never")
	p.checkEnum("kernel-log", raw.KernelLog, "auto", "off")
	cfg.GPM = raw.GPM
	if raw.PID < 0 {
		p.errorf("--pid: must be 0 (all) or a PID, got %d", raw.PID)
	}

	cfg.RefreshInterval = p.seconds("refresh-interval", raw.RefreshInterval, 1)
	cfg.GCInterval = p.seconds("gc-interval", raw.GCInterval, 1)
	cfg.ReportInterval = p.seconds("report-interval", raw.ReportInterval, 0)
	cfg.NVMLInterval = p.seconds("nvml-interval", raw.NVMLInterval, 1)
	cfg.GPMInterval = p.seconds("gpm-interval", raw.GPMInterval, 1)
	cfg.NCCLHangTimeout = p.seconds("nccl-hang-timeout", raw.NCCLHangTimeout, 0)
	cfg.CrashWindow = p.seconds("crash-window", raw.CrashWindow, 0)
	cfg.QuarantineLift = p.seconds("quarantine-lift", raw.QuarantineLift, 0)
	if raw.QuarantineLift > 0 && raw.CrashWindow == 0 {
		p.warnf("--quarantine-lift is ignored: --crash-window 0 turns the crash circuit breaker off")
	}

	p.checkMin("max-time-series", raw.MaxTimeSeries, 1)
	p.checkMin("max-streams-per-pid", raw.MaxStreamsPerPID, 1)
	p.checkMin("max-kernels-per-pid", raw.MaxKernelsPerPID, 1)
	p.checkMin("max-attached-files-per-pid", raw.MaxAttachedFilesPerPID, 1)
	p.checkMin("max-attached-files", raw.MaxAttachedFiles, 1)
	p.checkMin("max-probe-descriptors", raw.MaxProbeDescriptors, 0)
	cfg.MaxTeardown = p.seconds("max-teardown", raw.MaxTeardown, 0)
	p.checkMin("sample-rate", raw.SampleRate, 1)
	if raw.OverheadBudget < 0 || raw.OverheadBudget > 100 || math.IsNaN(raw.OverheadBudget) {
		p.errorf("%s: must be a percentage from 0 (off) to 100, got %v", p.source("overhead-budget"), raw.OverheadBudget)
	}
	cfg.OverheadBudget = raw.OverheadBudget / 100

	cfg.EntriesSize = p.mapSize("entries-size", raw.EntriesSize)
	cfg.AggregatedSize = p.mapSize("aggregated-size", raw.AggregatedSize)
	cfg.LaunchAggSize = p.mapSize("launch-agg-size", raw.LaunchAggSize)
	cfg.MallocSizesSize = p.mapSize("malloc-sizes-size", raw.MallocSizesSize)

	cfg.LogLevel = p.logLevel(raw.LogLevel)
	cfg.OTLP = p.resolveOTLP(raw)
	cfg.MetricsTLS, cfg.MetricsAuth = p.metricsSecurity(raw)

	return cfg
}

func (p *parser) checkListen(addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		p.errorf("--listen: %q is not a host:port address: %w", addr, err)
		return
	}
	// Named ports ("http") would need a lookup and the chart parses the port as a number.
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		p.errorf("--listen: port %q must be a number from 0 to 65535", port)
	}
}

func (p *parser) checkEnum(flag, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	p.errorf("%s: %q is not valid (want %s)", p.source(flag), v, orList(allowed))
}

func (p *parser) checkMin(flag string, v, lowest int) {
	if v < lowest {
		p.errorf("%s: must be at least %d, got %d", p.source(flag), lowest, v)
	}
}

// seconds validates a seconds value against lowest and converts it.
func (p *parser) seconds(flag string, v, lowest int) time.Duration {
	switch {
	case v < lowest && lowest == 1:
		p.errorf("%s: must be greater than 0 seconds, got %d", p.source(flag), v)
	case v < lowest:
		p.errorf("%s: must be at least %d seconds, got %d", p.source(flag), lowest, v)
	case v > maxSeconds:
		p.errorf("%s: must be at most %d seconds, got %d", p.source(flag), maxSeconds, v)
	default:
		return time.Duration(v) * time.Second
	}
	return 0
}

func (p *parser) mapSize(flag string, v int64) uint32 {
	if v < 1 || v > maxMapEntries {
		p.errorf("--%s: must be from 1 to %d entries, got %d", flag, maxMapEntries, v)
		return 0
	}
	return uint32(v)
}

// logLevel picks --log-level / PROFI_LOG_LEVEL, else RUST_LOG, else info.
func (p *parser) logLevel(flagValue string) slog.Level {
	if v := strings.TrimSpace(flagValue); v != "" {
		l, ok := parseLevel(v)
		if !ok {
			p.errorf("%s: unknown log level %q (want error, warn, info, debug or trace)", p.source("log-level"), v)
		}
		return l
	}
	v := p.env(envRustLog)
	if v == "" {
		return slog.LevelInfo
	}
	l, filtered, err := parseRustLog(v)
	if err != nil {
		p.errorf("%s: %w", envRustLog, err)
	}
	if filtered {
		p.warnf("%s=%q: module filters are ignored; using log level %s", envRustLog, v, levelName(l))
	}
	return l
}

// parseLevel accepts the RUST_LOG level names, case-insensitively as env_logger does.
func parseLevel(s string) (slog.Level, bool) {
	switch strings.ToLower(s) {
	case "error":
		return slog.LevelError, true
	case "warn":
		return slog.LevelWarn, true
	case "info":
		return slog.LevelInfo, true
	case "debug":
		return slog.LevelDebug, true
	case "trace":
		return slog.LevelDebug - 4, true
	}
	return slog.LevelInfo, false
}

func levelName(l slog.Level) string {
	if l < slog.LevelDebug {
		return "trace"
	}
	return strings.ToLower(l.String())
}

// parseRustLog reads env_logger syntax: comma-separated directives, each a plain level or a
// module=level filter, optionally followed by /regex. Only the first plain level is used, since
// profi has no module hierarchy; filtered reports that something was ignored.
func parseRustLog(s string) (level slog.Level, filtered bool, err error) {
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s, filtered = s[:i], true
	}
	level, found := slog.LevelInfo, false
	for _, d := range strings.Split(s, ",") {
		d = strings.TrimSpace(d)
		switch {
		case d == "":
		case strings.Contains(d, "="):
			filtered = true
		case found:
			// env_logger lets a later plain level override; keeping the first is what we document.
		default:
			l, ok := parseLevel(d)
			if !ok {
				return slog.LevelInfo, filtered, fmt.Errorf("unknown log level %q (want error, warn, info, debug or trace)", d)
			}
			level, found = l, true
		}
	}
	return level, filtered, nil
}

// pick returns a flag's value when it was given on the command line, else the first non-blank
// env var, else the flag's default (which kong put in cur). src names the origin.
func (p *parser) pick(flag, cur string, envs ...string) (val, src string) {
	if p.onCLI[flag] {
		return strings.TrimSpace(cur), "--" + flag
	}
	for _, e := range envs {
		if v := p.env(e); v != "" {
			return v, e
		}
	}
	return strings.TrimSpace(cur), "--" + flag
}

// pickDuration is pick for a seconds flag whose env vars are milliseconds (OTLP specification).
func (p *parser) pickDuration(flag string, secs int, envs ...string) time.Duration {
	if !p.onCLI[flag] {
		for _, e := range envs {
			v := p.env(e)
			if v == "" {
				continue
			}
			ms, err := strconv.ParseInt(v, 10, 64)
			switch {
			case err != nil:
				p.errorf("%s: %q is not an integer number of milliseconds", e, v)
			case ms <= 0:
				p.errorf("%s: must be greater than 0 milliseconds, got %d", e, ms)
			case ms > maxSeconds*1000:
				p.errorf("%s: must be at most %d milliseconds, got %d", e, int64(maxSeconds)*1000, ms)
			default:
				return time.Duration(ms) * time.Millisecond
			}
			return 0
		}
	}
	return p.seconds(flag, secs, 1)
}

func (p *parser) resolveOTLP(raw *cli) OTLPConfig {
	var o OTLPConfig

	proto, protoSrc := p.pick("otlp-protocol", raw.OTLPProtocol, envOTLPMetricsProtocol, envOTLPProtocol)
	switch strings.ToLower(proto) {
	case "grpc", "grpc/protobuf":
		o.Protocol = ProtocolGRPC
	case "http/protobuf", "http":
		o.Protocol = ProtocolHTTPProtobuf
	case "http/json":
		p.errorf("%s: protocol %q is not supported (use grpc or http/protobuf)", protoSrc, proto)
	default:
		p.errorf("%s: unknown protocol %q (want grpc, grpc/protobuf, http/protobuf or http)", protoSrc, proto)
	}

	o.Interval = p.pickDuration("otlp-interval-secs", raw.OTLPIntervalSecs, envOTLPInterval)
	o.Timeout = p.pickDuration("otlp-timeout-secs", raw.OTLPTimeoutSecs, envOTLPMetricsTimeout, envOTLPTimeout)

	var src string
	o.ServiceName, src = p.pick("otlp-service-name", raw.OTLPServiceName, envOTLPServiceName)
	if o.ServiceName == "" {
		p.errorf("%s: service name must not be blank", src)
	}

	headers, src := p.pick("otlp-headers", raw.OTLPHeaders, envOTLPMetricsHeaders, envOTLPHeaders)
	o.Headers = p.parsePairs(src, headers)
	attrs, src := p.pick("otlp-resource-attrs", raw.OTLPResourceAttrs, envOTLPResourceAttrs)
	o.ResourceAttrs = p.parsePairs(src, attrs)

	o.CACert, _ = p.pick("otlp-ca-cert", raw.OTLPCACert, envOTLPMetricsCACert, envOTLPCACert)
	o.ClientCert, _ = p.pick("otlp-client-cert", raw.OTLPClientCert, envOTLPMetricsClient, envOTLPClientCert)
	o.ClientKey, _ = p.pick("otlp-client-key", raw.OTLPClientKey, envOTLPMetricsKey, envOTLPClientKey)
	if (o.ClientCert == "") != (o.ClientKey == "") {
		p.errorf("otlp: client certificate and client key must be set together (--otlp-client-cert, --otlp-client-key)")
	}

	o.Insecure = raw.OTLPInsecure
	if !p.onCLI["otlp-insecure"] {
		for _, e := range []string{envOTLPMetricsInsecure, envOTLPInsecure} {
			if v := p.env(e); v != "" {
				b, err := strconv.ParseBool(strings.ToLower(v))
				if err != nil {
					p.errorf("%s: %q is not true or false", e, v)
				}
				o.Insecure = b
				break
			}
		}
	}

	endpoint, src := p.pick("otlp-endpoint", raw.OTLPEndpoint, envOTLPMetricsEndpoint, envOTLPEndpoint)
	if endpoint != "" {
		o.SignalSpecific = src == envOTLPMetricsEndpoint
		o.Endpoint = p.endpoint(src, endpoint, o.Protocol, o.SignalSpecific)
	}
	return o
}

// endpoint validates an OTLP endpoint and, for a generic http/protobuf endpoint, appends the
// metrics path.
func (p *parser) endpoint(src, endpoint, protocol string, signalSpecific bool) string {
	if protocol == ProtocolGRPC && !strings.Contains(endpoint, "://") {
		// gRPC also takes a bare host:port.
		if _, _, err := net.SplitHostPort(endpoint); err != nil {
			p.errorf("%s: %q is neither a http(s):// URL nor host:port", src, endpoint)
		}
		return endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.errorf("%s: %q is not a http:// or https:// URL", src, endpoint)
		return ""
	}
	if protocol != ProtocolHTTPProtobuf || signalSpecific {
		return endpoint
	}
	// Users of the Rust exporter had to put the path in the base URL themselves; do not double it.
	if !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), metricsPath) {
		u.Path = strings.TrimSuffix(u.Path, "/") + metricsPath
		u.RawPath = ""
	}
	return u.String()
}

// parsePairs reads "k=v,k=v" (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES): whitespace
// is trimmed and values are percent-decoded as the OpenTelemetry specification defines. Malformed
// pairs are dropped with a warning that names the pair by position only, because header values
// are often credentials. Returns nil for an empty list.
func (p *parser) parsePairs(src, s string) map[string]string {
	var out map[string]string
	for i, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			p.warnf("%s: dropped malformed pair %d (want key=value)", src, i+1)
			continue
		}
		dk, errK := url.PathUnescape(k)
		dv, errV := url.PathUnescape(v)
		if errK != nil || errV != nil {
			p.warnf("%s: dropped pair %d with invalid percent-encoding", src, i+1)
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[dk] = dv
	}
	return out
}

// metricsSecurity validates the /metrics TLS and auth combination rules of docs/INTERFACE.md 2.5.
func (p *parser) metricsSecurity(raw *cli) (TLSConfig, AuthConfig) {
	t := TLSConfig{
		Mode:         strings.TrimSpace(raw.MetricsTLSMode),
		CertFile:     strings.TrimSpace(raw.MetricsTLSCert),
		KeyFile:      strings.TrimSpace(raw.MetricsTLSKey),
		ClientCAFile: strings.TrimSpace(raw.MetricsTLSClientCA),
	}
	for san := range strings.SplitSeq(raw.MetricsTLSClientSANs, ",") {
		if san = strings.TrimSpace(san); san != "" {
			t.AllowedClientSANs = append(t.AllowedClientSANs, san)
		}
	}
	a := AuthConfig{
		Mode:      strings.TrimSpace(raw.MetricsAuthMode),
		Audience:  strings.TrimSpace(raw.MetricsAuthAudience),
		CacheSize: raw.MetricsAuthCacheSize,
		Authorize: raw.MetricsAuthAuthorize,
	}
	// 0 is allowed: no caching of successful TokenReviews.
	a.CacheTTL = p.seconds("metrics-auth-cache-ttl", raw.MetricsAuthCacheTTL, 0)
	p.checkMin("metrics-auth-cache-size", raw.MetricsAuthCacheSize, 1)

	p.checkEnum("metrics-tls-mode", t.Mode, TLSModeOff, TLSModeServer, TLSModeMTLS)
	p.checkEnum("metrics-auth-mode", a.Mode, AuthModeOff, AuthModeBearer, AuthModeMTLSOrBearer)

	if t.Mode == TLSModeServer || t.Mode == TLSModeMTLS {
		if t.CertFile == "" {
			p.errorf("--metrics-tls-mode=%s needs --metrics-tls-cert", t.Mode)
		}
		if t.KeyFile == "" {
			p.errorf("--metrics-tls-mode=%s needs --metrics-tls-key", t.Mode)
		}
	}
	if t.Mode == TLSModeMTLS && t.ClientCAFile == "" {
		p.errorf("--metrics-tls-mode=mtls needs --metrics-tls-client-ca")
	}
	if a.Mode == AuthModeMTLSOrBearer && t.Mode != TLSModeMTLS {
		p.errorf("--metrics-auth-mode=mtls-or-bearer needs --metrics-tls-mode=mtls, got %q", t.Mode)
	}
	if a.Mode == AuthModeBearer && t.Mode == TLSModeMTLS {
		p.errorf("--metrics-tls-mode=mtls with --metrics-auth-mode=bearer is not allowed: " +
			"to accept a client certificate or a bearer token use --metrics-auth-mode=mtls-or-bearer")
	}

	// Material that has no effect is likely a forgotten mode flag; say so instead of failing.
	if t.Mode == TLSModeOff && (t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "") {
		p.warnf("--metrics-tls-mode=off: the TLS certificate, key and client CA settings are ignored")
	} else if t.Mode == TLSModeServer && t.ClientCAFile != "" {
		p.warnf("--metrics-tls-mode=server: --metrics-tls-client-ca is ignored (only mtls checks client certificates)")
	}
	if t.Mode != TLSModeMTLS && len(t.AllowedClientSANs) > 0 {
		p.warnf("--metrics-tls-mode=%s: --metrics-tls-allowed-client-sans is ignored (only mtls checks client certificates)", t.Mode)
	}
	if a.Mode == AuthModeOff && a.Audience != "" {
		p.warnf("--metrics-auth-mode=off: --metrics-auth-audience is ignored")
	}
	if a.Mode == AuthModeOff && a.Authorize {
		p.warnf("--metrics-auth-mode=off: --metrics-auth-authorize is ignored")
	}
	return t, a
}

// Unsupported lists settings that are set to a non-default value but whose feature has not landed
// yet, one sentence each, in flag order. An empty result means everything set is honoured.
// Every setting has landed at present; the function stays for the next one.
func (c *Config) Unsupported() []string {
	return nil
}

// orList formats allowed values as "a, b or c".
func orList(vals []string) string {
	if len(vals) == 1 {
		return vals[0]
	}
	return strings.Join(vals[:len(vals)-1], ", ") + " or " + vals[len(vals)-1]
}
