package config

import (
	"bytes"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// envOf returns a getenv backed by m.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func mustParse(t *testing.T, args []string, env map[string]string) (*Config, []string) {
	t.Helper()
	cfg, warns, err := Parse(args, envOf(env))
	if err != nil {
		t.Fatalf("Parse(%q): %v", args, err)
	}
	return cfg, warns
}

func mustFail(t *testing.T, args []string, env map[string]string, wants ...string) error {
	t.Helper()
	cfg, _, err := Parse(args, envOf(env))
	if err == nil {
		t.Fatalf("Parse(%q, %v) succeeded, want error containing %q", args, env, wants)
	}
	if cfg != nil {
		t.Errorf("Parse returned a config together with an error")
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	return err
}

// defaults is docs/INTERFACE.md sections 2.1, 2.4 and 2.5 written out by hand.
func defaults() Config {
	return Config{
		Listen:                 "0.0.0.0:9401",
		ProcPath:               "/proc",
		KernelMode:             "anonymous",
		ProbeProfile:           "lean",
		Cudart:                 "/usr/local/cuda/lib64/libcudart.so",
		PID:                    0,
		NodeName:               "",
		RefreshInterval:        10 * time.Second,
		GCInterval:             60 * time.Second,
		ReportInterval:         0,
		NVMLInterval:           5 * time.Second,
		GPM:                    "auto",
		GPMInterval:            5 * time.Second,
		NCCLHangTimeout:        60 * time.Second,
		CrashWindow:            5 * time.Second,
		QuarantineLift:         10 * time.Minute,
		ProbeTracedProcesses:   "auto",
		KernelLog:              "auto",
		MaxTimeSeries:          50000,
		MaxStreamsPerPID:       32,
		MaxKernelsPerPID:       512,
		MaxAttachedFilesPerPID: 64,
		MaxAttachedFiles:       1024,
		SampleRate:             1,
		EntriesSize:            10240,
		AggregatedSize:         2048,
		LaunchAggSize:          8192,
		MallocSizesSize:        131072,
		LogLevel:               slog.LevelInfo,
		OTLP: OTLPConfig{
			Protocol:    ProtocolGRPC,
			Interval:    60 * time.Second,
			Timeout:     10 * time.Second,
			ServiceName: "profi",
		},
		MetricsTLS:  TLSConfig{Mode: "off"},
		MetricsAuth: AuthConfig{Mode: "off", CacheTTL: 60 * time.Second, CacheSize: 1024},
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg, warns := mustParse(t, nil, nil)
	if want := defaults(); !reflect.DeepEqual(*cfg, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", *cfg, want)
	}
	if len(warns) != 0 {
		t.Errorf("warnings with defaults: %q", warns)
	}
	if u := cfg.Unsupported(); len(u) != 0 {
		t.Errorf("Unsupported with defaults: %q", u)
	}
	if cfg.OTLP.Enabled() {
		t.Errorf("OTLP enabled by default")
	}
	if d := Default(); !reflect.DeepEqual(d, cfg) {
		t.Errorf("Default() = %+v, want %+v", d, cfg)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want func(*Config)
	}{
		{"listen", []string{"--listen=127.0.0.1:8080"}, func(c *Config) { c.Listen = "127.0.0.1:8080" }},
		{"listen ipv6", []string{"--listen", "[::]:0"}, func(c *Config) { c.Listen = "[::]:0" }},
		{"listen empty host", []string{"--listen=:65535"}, func(c *Config) { c.Listen = ":65535" }},
		{"proc-path", []string{"--proc-path=/host/proc"}, func(c *Config) { c.ProcPath = "/host/proc" }},
		{"kernel-mode off", []string{"--kernel-mode=off"}, func(c *Config) { c.KernelMode = "off" }},
		{"kernel-mode full", []string{"--kernel-mode=full"}, func(c *Config) { c.KernelMode = "full" }},
		{"probe-profile", []string{"--probe-profile=full"}, func(c *Config) { c.ProbeProfile = "full" }},
		{"cudart", []string{"--cudart=/x/libcudart.so.12"}, func(c *Config) { c.Cudart = "/x/libcudart.so.12" }},
		{"pid long", []string{"--pid=42"}, func(c *Config) { c.PID = 42 }},
		{"pid short", []string{"-p", "42"}, func(c *Config) { c.PID = 42 }},
		{"pid short joined", []string{"-p42"}, func(c *Config) { c.PID = 42 }},
		{"refresh-interval", []string{"--refresh-interval=3"}, func(c *Config) { c.RefreshInterval = 3 * time.Second }},
		{"gc-interval", []string{"--gc-interval=120"}, func(c *Config) { c.GCInterval = 2 * time.Minute }},
		{"report-interval", []string{"--report-interval=7"}, func(c *Config) { c.ReportInterval = 7 * time.Second }},
		{"enable-nvtx-tracing", []string{"--enable-nvtx-tracing"}, func(c *Config) { c.EnableNVTX = true }},
		{"disable-nvml", []string{"--disable-nvml"}, func(c *Config) { c.DisableNVML = true }},
		{"nvml-interval", []string{"--nvml-interval=9"}, func(c *Config) { c.NVMLInterval = 9 * time.Second }},
		{"gpm", []string{"--gpm=off", "--gpm-interval=2"}, func(c *Config) { c.GPM = "off"; c.GPMInterval = 2 * time.Second }},
		{"nccl-hang-timeout", []string{"--nccl-hang-timeout=0"}, func(c *Config) { c.NCCLHangTimeout = 0 }},
		{"crash-window", []string{"--crash-window=2"}, func(c *Config) { c.CrashWindow = 2 * time.Second }},
		{"crash-window off", []string{"--crash-window=0"}, func(c *Config) { c.CrashWindow = 0 }},
		{"quarantine-lift", []string{"--quarantine-lift=600"}, func(c *Config) { c.QuarantineLift = 10 * time.Minute }},
		{"allow-unsafe-kernel", []string{"--allow-unsafe-kernel"}, func(c *Config) { c.AllowUnsafeKernel = true }},
		{"kernel-log off", []string{"--kernel-log=off"}, func(c *Config) { c.KernelLog = "off" }},
		{"probe-traced-processes", []string{"--probe-traced-processes=never"}, func(c *Config) { c.ProbeTracedProcesses = "never" }},
		{"max-time-series", []string{"--max-time-series=7"}, func(c *Config) { c.MaxTimeSeries = 7 }},
		{"max-streams-per-pid", []string{"--max-streams-per-pid=1"}, func(c *Config) { c.MaxStreamsPerPID = 1 }},
		{"max-kernels-per-pid", []string{"--max-kernels-per-pid=64"}, func(c *Config) { c.MaxKernelsPerPID = 64 }},
		{"max-attached-files-per-pid", []string{"--max-attached-files-per-pid=8"}, func(c *Config) { c.MaxAttachedFilesPerPID = 8 }},
		{"max-attached-files", []string{"--max-attached-files=100"}, func(c *Config) { c.MaxAttachedFiles = 100 }},
		{"max-probe-descriptors", []string{"--max-probe-descriptors=20000"}, func(c *Config) { c.MaxProbeDescriptors = 20000 }},
		{"max-teardown", []string{"--max-teardown=60"}, func(c *Config) { c.MaxTeardown = time.Minute }},
		{"sample-rate", []string{"--sample-rate=10"}, func(c *Config) { c.SampleRate = 10 }},
		{"entries-size", []string{"--entries-size=1"}, func(c *Config) { c.EntriesSize = 1 }},
		{"aggregated-size", []string{"--aggregated-size=4096"}, func(c *Config) { c.AggregatedSize = 4096 }},
		{"launch-agg-size", []string{"--launch-agg-size=16777216"}, func(c *Config) { c.LaunchAggSize = 1 << 24 }},
		{"malloc-sizes-size", []string{"--malloc-sizes-size=5"}, func(c *Config) { c.MallocSizesSize = 5 }},
		{"detailed-launches", []string{"--detailed-launches"}, func(c *Config) { c.DetailedLaunches = true }},
		{"overhead-budget", []string{"--overhead-budget=2.5"}, func(c *Config) { c.OverheadBudget = 0.025 }},
		{"log-level", []string{"--log-level=debug"}, func(c *Config) { c.LogLevel = slog.LevelDebug }},
		{"otlp-service-name", []string{"--otlp-service-name=gpu"}, func(c *Config) { c.OTLP.ServiceName = "gpu" }},
		{"otlp-interval-secs", []string{"--otlp-interval-secs=15"}, func(c *Config) { c.OTLP.Interval = 15 * time.Second }},
		{"otlp-timeout-secs", []string{"--otlp-timeout-secs=3"}, func(c *Config) { c.OTLP.Timeout = 3 * time.Second }},
		{"otlp-ca-cert", []string{"--otlp-ca-cert=/ca.pem"}, func(c *Config) { c.OTLP.CACert = "/ca.pem" }},
		{"otlp-client-cert and key", []string{"--otlp-client-cert=/c.pem", "--otlp-client-key=/k.pem"}, func(c *Config) {
			c.OTLP.ClientCert, c.OTLP.ClientKey = "/c.pem", "/k.pem"
		}},
		{"otlp-insecure", []string{"--otlp-insecure"}, func(c *Config) { c.OTLP.Insecure = true }},
		{"otlp-headers", []string{"--otlp-headers=a=1"}, func(c *Config) { c.OTLP.Headers = map[string]string{"a": "1"} }},
		{"otlp-resource-attrs", []string{"--otlp-resource-attrs=env=prod"}, func(c *Config) {
			c.OTLP.ResourceAttrs = map[string]string{"env": "prod"}
		}},
		{"metrics-auth-audience", []string{"--metrics-auth-audience=profi"}, func(c *Config) { c.MetricsAuth.Audience = "profi" }},
		{"metrics-auth-cache-ttl", []string{"--metrics-auth-cache-ttl=0"}, func(c *Config) { c.MetricsAuth.CacheTTL = 0 }},
		{"metrics-auth-cache-size", []string{"--metrics-auth-cache-size=1"}, func(c *Config) { c.MetricsAuth.CacheSize = 1 }},
		{"metrics-tls server", []string{"--metrics-tls-mode=server", "--metrics-tls-cert=/c", "--metrics-tls-key=/k"}, func(c *Config) {
			c.MetricsTLS = TLSConfig{Mode: "server", CertFile: "/c", KeyFile: "/k"}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _ := mustParse(t, tc.args, nil)
			want := defaults()
			tc.want(&want)
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("Parse(%q):\n got %+v\nwant %+v", tc.args, *got, want)
			}
		})
	}
}

func TestEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want func(*Config)
	}{
		{"NODE_NAME", map[string]string{"NODE_NAME": "gpu-1"}, func(c *Config) { c.NodeName = "gpu-1" }},
		{"NODE_NAME blank is unset", map[string]string{"NODE_NAME": "  "}, func(*Config) {}},
		{"PROFI_LOG_LEVEL", map[string]string{"PROFI_LOG_LEVEL": "warn"}, func(c *Config) { c.LogLevel = slog.LevelWarn }},
		{"RUST_LOG", map[string]string{"RUST_LOG": "error"}, func(c *Config) { c.LogLevel = slog.LevelError }},
		{"PROFI_METRICS_TLS_* server", map[string]string{
			"PROFI_METRICS_TLS_MODE": "server", "PROFI_METRICS_TLS_CERT": "/c", "PROFI_METRICS_TLS_KEY": "/k",
		}, func(c *Config) { c.MetricsTLS = TLSConfig{Mode: "server", CertFile: "/c", KeyFile: "/k"} }},
		{"PROFI_METRICS_TLS_CLIENT_CA and AUTH_MODE", map[string]string{
			"PROFI_METRICS_TLS_MODE": "mtls", "PROFI_METRICS_TLS_CERT": "/c", "PROFI_METRICS_TLS_KEY": "/k",
			"PROFI_METRICS_TLS_CLIENT_CA": "/ca", "PROFI_METRICS_AUTH_MODE": "mtls-or-bearer",
		}, func(c *Config) {
			c.MetricsTLS = TLSConfig{Mode: "mtls", CertFile: "/c", KeyFile: "/k", ClientCAFile: "/ca"}
			c.MetricsAuth.Mode = "mtls-or-bearer"
		}},
		{"PROFI_METRICS_AUTH_AUDIENCE", map[string]string{"PROFI_METRICS_AUTH_MODE": "bearer", "PROFI_METRICS_AUTH_AUDIENCE": "aud"},
			func(c *Config) { c.MetricsAuth.Mode, c.MetricsAuth.Audience = "bearer", "aud" }},
		{"PROFI_METRICS_AUTH_CACHE_TTL", map[string]string{"PROFI_METRICS_AUTH_CACHE_TTL": "30"},
			func(c *Config) { c.MetricsAuth.CacheTTL = 30 * time.Second }},
		{"PROFI_METRICS_AUTH_CACHE_SIZE", map[string]string{"PROFI_METRICS_AUTH_CACHE_SIZE": "7"},
			func(c *Config) { c.MetricsAuth.CacheSize = 7 }},
		{"PROFI_METRICS_AUTH_AUTHORIZE", map[string]string{"PROFI_METRICS_AUTH_MODE": "bearer", "PROFI_METRICS_AUTH_AUTHORIZE": "true"},
			func(c *Config) { c.MetricsAuth.Mode, c.MetricsAuth.Authorize = "bearer", true }},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://col:4317"},
			func(c *Config) { c.OTLP.Endpoint = "http://col:4317" }},
		{"OTEL_EXPORTER_OTLP_ENDPOINT blank is off", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, func(*Config) {}},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			func(c *Config) { c.OTLP.Protocol = ProtocolHTTPProtobuf }},
		{"OTEL_METRIC_EXPORT_INTERVAL", map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "15000"},
			func(c *Config) { c.OTLP.Interval = 15 * time.Second }},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"},
			func(c *Config) { c.OTLP.Timeout = 2500 * time.Millisecond }},
		{"OTEL_SERVICE_NAME", map[string]string{"OTEL_SERVICE_NAME": "svc"}, func(c *Config) { c.OTLP.ServiceName = "svc" }},
		{"OTEL_EXPORTER_OTLP_HEADERS", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=2"},
			func(c *Config) { c.OTLP.Headers = map[string]string{"a": "1", "b": "2"} }},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE", map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca"},
			func(c *Config) { c.OTLP.CACert = "/ca" }},
		{"OTEL_EXPORTER_OTLP_CLIENT_*", map[string]string{
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/c", "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k",
		}, func(c *Config) { c.OTLP.ClientCert, c.OTLP.ClientKey = "/c", "/k" }},
		{"OTEL_EXPORTER_OTLP_INSECURE", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true"},
			func(c *Config) { c.OTLP.Insecure = true }},
		{"OTEL_EXPORTER_OTLP_METRICS_INSECURE", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_INSECURE": "TRUE"},
			func(c *Config) { c.OTLP.Insecure = true }},
		{"OTEL_RESOURCE_ATTRIBUTES", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"},
			func(c *Config) { c.OTLP.ResourceAttrs = map[string]string{"deployment.environment": "prod"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _ := mustParse(t, nil, tc.env)
			want := defaults()
			tc.want(&want)
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("env %v:\n got %+v\nwant %+v", tc.env, *got, want)
			}
		})
	}
}

// TestEnvNotReadFromProcess checks that only getenv is consulted, never os.Getenv.
func TestEnvNotReadFromProcess(t *testing.T) {
	t.Setenv("NODE_NAME", "from-process")
	t.Setenv("PROFI_METRICS_AUTH_CACHE_SIZE", "not-a-number")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1")
	cfg, _ := mustParse(t, nil, nil)
	if cfg.NodeName != "" || cfg.OTLP.Endpoint != "" || cfg.MetricsAuth.CacheSize != 1024 {
		t.Errorf("process environment leaked into config: %+v", cfg)
	}
}

func TestFlagBeatsEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		got  func(*Config) any
		want any
	}{
		{"node-name", []string{"--node-name=flag"}, map[string]string{"NODE_NAME": "env"},
			func(c *Config) any { return c.NodeName }, "flag"},
		{"log-level over PROFI_LOG_LEVEL", []string{"--log-level=error"}, map[string]string{"PROFI_LOG_LEVEL": "debug"},
			func(c *Config) any { return c.LogLevel }, slog.LevelError},
		{"metrics-auth-cache-ttl", []string{"--metrics-auth-cache-ttl=5"}, map[string]string{"PROFI_METRICS_AUTH_CACHE_TTL": "99"},
			func(c *Config) any { return c.MetricsAuth.CacheTTL }, 5 * time.Second},
		{"metrics-auth-cache-size", []string{"--metrics-auth-cache-size=5"}, map[string]string{"PROFI_METRICS_AUTH_CACHE_SIZE": "99"},
			func(c *Config) any { return c.MetricsAuth.CacheSize }, 5},
		{"metrics-tls-mode", []string{"--metrics-tls-mode=off"}, map[string]string{"PROFI_METRICS_TLS_MODE": "server"},
			func(c *Config) any { return c.MetricsTLS.Mode }, "off"},
		{"metrics-auth-audience", []string{"--metrics-auth-audience=f", "--metrics-auth-mode=bearer"},
			map[string]string{"PROFI_METRICS_AUTH_AUDIENCE": "e"},
			func(c *Config) any { return c.MetricsAuth.Audience }, "f"},
		{"metrics-auth-mode", []string{"--metrics-auth-mode=off"}, map[string]string{"PROFI_METRICS_AUTH_MODE": "bearer"},
			func(c *Config) any { return c.MetricsAuth.Mode }, "off"},
		{"otlp-endpoint over both env forms", []string{"--otlp-endpoint=http://flag:4317"},
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:1", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:1"},
			func(c *Config) any { return c.OTLP.Endpoint }, "http://flag:4317"},
		{"blank otlp-endpoint flag turns push off", []string{"--otlp-endpoint="},
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:1"},
			func(c *Config) any { return c.OTLP.Endpoint }, ""},
		{"otlp-protocol", []string{"--otlp-protocol=grpc"},
			map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http"},
			func(c *Config) any { return c.OTLP.Protocol }, ProtocolGRPC},
		{"otlp-interval-secs over OTEL_METRIC_EXPORT_INTERVAL", []string{"--otlp-interval-secs=30"},
			map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "5000"},
			func(c *Config) any { return c.OTLP.Interval }, 30 * time.Second},
		{"otlp-interval-secs given at its default still wins", []string{"--otlp-interval-secs=60"},
			map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "5000"},
			func(c *Config) any { return c.OTLP.Interval }, 60 * time.Second},
		{"otlp-timeout-secs", []string{"--otlp-timeout-secs=4"},
			map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2000"},
			func(c *Config) any { return c.OTLP.Timeout }, 4 * time.Second},
		{"otlp-service-name", []string{"--otlp-service-name=f"}, map[string]string{"OTEL_SERVICE_NAME": "e"},
			func(c *Config) any { return c.OTLP.ServiceName }, "f"},
		{"otlp-headers", []string{"--otlp-headers=f=1"},
			map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "e=1", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "m=1"},
			func(c *Config) any { return c.OTLP.Headers }, map[string]string{"f": "1"}},
		{"otlp-ca-cert", []string{"--otlp-ca-cert=/f"},
			map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/e", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": "/m"},
			func(c *Config) any { return c.OTLP.CACert }, "/f"},
		{"otlp-client-cert and key", []string{"--otlp-client-cert=/fc", "--otlp-client-key=/fk"},
			map[string]string{"OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "/mc", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": "/mk"},
			func(c *Config) any { return [2]string{c.OTLP.ClientCert, c.OTLP.ClientKey} }, [2]string{"/fc", "/fk"}},
		{"otlp-insecure=false over env true", []string{"--otlp-insecure=false"},
			map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "true"},
			func(c *Config) any { return c.OTLP.Insecure }, false},
		{"otlp-insecure over env false", []string{"--otlp-insecure"}, map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "false"},
			func(c *Config) any { return c.OTLP.Insecure }, true},
		{"otlp-resource-attrs", []string{"--otlp-resource-attrs=f=1"}, map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "e=1"},
			func(c *Config) any { return c.OTLP.ResourceAttrs }, map[string]string{"f": "1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, _ := mustParse(t, tc.args, tc.env)
			if got := tc.got(cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse(%q, %v) = %v, want %v", tc.args, tc.env, got, tc.want)
			}
		})
	}
}

func TestOTLPSignalSpecificEnvWins(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		got  func(*OTLPConfig) any
		want any
	}{
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://g:4317", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4317"},
			func(o *OTLPConfig) any { return [2]any{o.Endpoint, o.SignalSpecific} }, [2]any{"http://m:4317", true}},
		{"protocol", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"},
			func(o *OTLPConfig) any { return o.Protocol }, ProtocolHTTPProtobuf},
		{"timeout", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "250"},
			func(o *OTLPConfig) any { return o.Timeout }, 250 * time.Millisecond},
		{"headers replace, not merge", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "g=1", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "m=2"},
			func(o *OTLPConfig) any { return o.Headers }, map[string]string{"m": "2"}},
		{"certificate", map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/g", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": "/m"},
			func(o *OTLPConfig) any { return o.CACert }, "/m"},
		{"client certificate and key", map[string]string{
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/gc", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "/mc",
			"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/gk", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": "/mk",
		}, func(o *OTLPConfig) any { return [2]string{o.ClientCert, o.ClientKey} }, [2]string{"/mc", "/mk"}},
		{"insecure", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "false"},
			func(o *OTLPConfig) any { return o.Insecure }, false},
		{"blank signal-specific falls back to generic", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://g:4317", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": ""},
			func(o *OTLPConfig) any { return [2]any{o.Endpoint, o.SignalSpecific} }, [2]any{"http://g:4317", false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, _ := mustParse(t, nil, tc.env)
			if got := tc.got(&cfg.OTLP); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("env %v: got %v, want %v", tc.env, got, tc.want)
			}
		})
	}
}

func TestOTLPMilliseconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		env          map[string]string
		wantInterval time.Duration
		wantTimeout  time.Duration
		wantErr      string
	}{
		{"interval ms", map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "60000"}, time.Minute, 10 * time.Second, ""},
		{"sub-second interval", map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "1500"}, 1500 * time.Millisecond, 10 * time.Second, ""},
		{"timeout ms, not seconds", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10"}, time.Minute, 10 * time.Millisecond, ""},
		{"metrics timeout ms", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "30000"}, time.Minute, 30 * time.Second, ""},
		{"zero interval", map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "0"}, 0, 0, "OTEL_METRIC_EXPORT_INTERVAL: must be greater than 0"},
		{"negative timeout", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, 0, 0, "OTEL_EXPORTER_OTLP_TIMEOUT: must be greater than 0"},
		{"not a number", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "10s"}, 0, 0, "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT: \"10s\" is not an integer"},
		{"overflow", map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "9223372036854775807"}, 0, 0, "must be at most"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.wantErr != "" {
				_ = mustFail(t, nil, tc.env, tc.wantErr)
				return
			}
			cfg, _ := mustParse(t, nil, tc.env)
			if cfg.OTLP.Interval != tc.wantInterval || cfg.OTLP.Timeout != tc.wantTimeout {
				t.Errorf("interval, timeout = %v, %v; want %v, %v", cfg.OTLP.Interval, cfg.OTLP.Timeout, tc.wantInterval, tc.wantTimeout)
			}
		})
	}
}

func TestOTLPEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"grpc flag kept", []string{"--otlp-endpoint=http://col:4317"}, nil, "http://col:4317", ""},
		{"grpc host:port", []string{"--otlp-endpoint=col:4317"}, nil, "col:4317", ""},
		{"grpc/protobuf alias", []string{"--otlp-endpoint=https://col:4317", "--otlp-protocol=grpc/protobuf"}, nil, "https://col:4317", ""},
		{"http flag gets path", []string{"--otlp-endpoint=http://col:4318", "--otlp-protocol=http/protobuf"}, nil, "http://col:4318/v1/metrics", ""},
		{"http alias gets path", []string{"--otlp-endpoint=http://col:4318/", "--otlp-protocol=http"}, nil, "http://col:4318/v1/metrics", ""},
		{"http base with prefix", []string{"--otlp-endpoint=https://gw/otlp", "--otlp-protocol=http"}, nil, "https://gw/otlp/v1/metrics", ""},
		{"http path not doubled", []string{"--otlp-endpoint=http://col:4318/v1/metrics", "--otlp-protocol=http"}, nil, "http://col:4318/v1/metrics", ""},
		{"http generic env gets path", nil, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://col:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		}, "http://col:4318/v1/metrics", ""},
		{"http signal-specific env used as given", nil, map[string]string{
			"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://col:4318/custom", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		}, "http://col:4318/custom", ""},
		{"blank flag is off", []string{"--otlp-endpoint=  "}, nil, "", ""},
		{"http needs a URL", []string{"--otlp-endpoint=col:4318", "--otlp-protocol=http"}, nil, "", `--otlp-endpoint: "col:4318" is not a http:// or https:// URL`},
		{"bad scheme", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://col:1"}, "", "OTEL_EXPORTER_OTLP_ENDPOINT: \"ftp://col:1\" is not a http"},
		{"grpc without port", []string{"--otlp-endpoint=col"}, nil, "", "neither a http(s):// URL nor host:port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.wantErr != "" {
				_ = mustFail(t, tc.args, tc.env, tc.wantErr)
				return
			}
			cfg, _ := mustParse(t, tc.args, tc.env)
			if cfg.OTLP.Endpoint != tc.want {
				t.Errorf("endpoint = %q, want %q", cfg.OTLP.Endpoint, tc.want)
			}
			if cfg.OTLP.Enabled() != (tc.want != "") {
				t.Errorf("Enabled() = %v with endpoint %q", cfg.OTLP.Enabled(), tc.want)
			}
		})
	}
}

func TestOTLPProtocol(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want, wantErr string
	}{
		{"grpc", ProtocolGRPC, ""},
		{"grpc/protobuf", ProtocolGRPC, ""},
		{"http/protobuf", ProtocolHTTPProtobuf, ""},
		{"http", ProtocolHTTPProtobuf, ""},
		{"http/json", "", `--otlp-protocol: protocol "http/json" is not supported`},
		{"thrift", "", `--otlp-protocol: unknown protocol "thrift"`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			args := []string{"--otlp-protocol=" + tc.in}
			if tc.wantErr != "" {
				_ = mustFail(t, args, nil, tc.wantErr)
				return
			}
			cfg, _ := mustParse(t, args, nil)
			if cfg.OTLP.Protocol != tc.want {
				t.Errorf("protocol = %q, want %q", cfg.OTLP.Protocol, tc.want)
			}
		})
	}
	t.Run("env error names the variable", func(t *testing.T) {
		t.Parallel()
		_ = mustFail(t, nil, map[string]string{"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"},
			`OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: protocol "http/json" is not supported`)
	})
}

func TestOTLPOtherChecks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"client cert without key", []string{"--otlp-client-cert=/c"}, nil, "client certificate and client key must be set together"},
		{"client key without cert", nil, map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k"}, "client certificate and client key must be set together"},
		{"bad insecure env", nil, map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, `OTEL_EXPORTER_OTLP_INSECURE: "yes" is not true or false`},
		{"blank service name", []string{"--otlp-service-name= "}, nil, "--otlp-service-name: service name must not be blank"},
		{"interval flag zero", []string{"--otlp-interval-secs=0"}, nil, "--otlp-interval-secs: must be greater than 0"},
		{"timeout flag negative", []string{"--otlp-timeout-secs=-1"}, nil, "--otlp-timeout-secs: must be greater than 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_ = mustFail(t, tc.args, tc.env, tc.wantErr)
		})
	}
}

func TestOTLPUseTLS(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		o    OTLPConfig
		want bool
	}{
		{"http endpoint", OTLPConfig{Endpoint: "http://c:4317"}, false},
		{"https endpoint", OTLPConfig{Endpoint: "https://c:4317"}, true},
		{"CA on plain endpoint", OTLPConfig{Endpoint: "c:4317", CACert: "/ca"}, true},
		{"client cert", OTLPConfig{Endpoint: "http://c:4318/v1/metrics", ClientCert: "/c", ClientKey: "/k"}, true},
		{"insecure wins", OTLPConfig{Endpoint: "https://c:4317", CACert: "/ca", Insecure: true}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.o.UseTLS(); got != tc.want {
				t.Errorf("UseTLS() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOTLPPairs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		want      map[string]string
		wantWarns int
	}{
		{"empty", "", nil, 0},
		{"whitespace trimmed", " a = 1 ,\tb=2 ", map[string]string{"a": "1", "b": "2"}, 0},
		{"value keeps inner =", "authorization=Basic abc==", map[string]string{"authorization": "Basic abc=="}, 0},
		{"percent-decoded", "Authorization=Bearer%20tok", map[string]string{"Authorization": "Bearer tok"}, 0},
		{"empty value allowed", "a=", map[string]string{"a": ""}, 0},
		{"trailing comma ignored", "a=1,", map[string]string{"a": "1"}, 0},
		{"malformed dropped", "a=1,secret-token,=2,b=2", map[string]string{"a": "1", "b": "2"}, 2},
		{"bad escape dropped", "a=%zz,b=1", map[string]string{"b": "1"}, 1},
		{"all malformed", "junk", nil, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, warns := mustParse(t, nil, map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": tc.in, "OTEL_RESOURCE_ATTRIBUTES": tc.in})
			if !reflect.DeepEqual(cfg.OTLP.Headers, tc.want) {
				t.Errorf("headers = %v, want %v", cfg.OTLP.Headers, tc.want)
			}
			if !reflect.DeepEqual(cfg.OTLP.ResourceAttrs, tc.want) {
				t.Errorf("resource attrs = %v, want %v", cfg.OTLP.ResourceAttrs, tc.want)
			}
			if len(warns) != 2*tc.wantWarns {
				t.Errorf("warnings = %q, want %d per variable", warns, tc.wantWarns)
			}
			for _, w := range warns {
				if strings.Contains(w, "secret") {
					t.Errorf("warning leaks the pair's content: %q", w)
				}
				if !strings.Contains(w, "OTEL_EXPORTER_OTLP_HEADERS") && !strings.Contains(w, "OTEL_RESOURCE_ATTRIBUTES") {
					t.Errorf("warning does not name its source: %q", w)
				}
			}
		})
	}
}

func TestLogLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		want     slog.Level
		wantWarn bool
		wantErr  string
	}{
		{"default info", nil, nil, slog.LevelInfo, false, ""},
		{"RUST_LOG error", nil, map[string]string{"RUST_LOG": "error"}, slog.LevelError, false, ""},
		{"RUST_LOG warn", nil, map[string]string{"RUST_LOG": "warn"}, slog.LevelWarn, false, ""},
		{"RUST_LOG info", nil, map[string]string{"RUST_LOG": "info"}, slog.LevelInfo, false, ""},
		{"RUST_LOG debug", nil, map[string]string{"RUST_LOG": "debug"}, slog.LevelDebug, false, ""},
		{"RUST_LOG trace", nil, map[string]string{"RUST_LOG": "trace"}, slog.LevelDebug - 4, false, ""},
		{"RUST_LOG upper case", nil, map[string]string{"RUST_LOG": "DEBUG"}, slog.LevelDebug, false, ""},
		{"RUST_LOG module filters only", nil, map[string]string{"RUST_LOG": "profi=debug,foo=info"}, slog.LevelInfo, true, ""},
		{"RUST_LOG plain level among filters", nil, map[string]string{"RUST_LOG": "profi=trace,warn"}, slog.LevelWarn, true, ""},
		{"RUST_LOG first plain level wins", nil, map[string]string{"RUST_LOG": "error,debug"}, slog.LevelError, false, ""},
		{"RUST_LOG regex filter", nil, map[string]string{"RUST_LOG": "debug/attach"}, slog.LevelDebug, true, ""},
		{"RUST_LOG unknown", nil, map[string]string{"RUST_LOG": "verbose"}, 0, false, `RUST_LOG: unknown log level "verbose"`},
		{"PROFI_LOG_LEVEL beats RUST_LOG", nil, map[string]string{"PROFI_LOG_LEVEL": "error", "RUST_LOG": "verbose"}, slog.LevelError, false, ""},
		{"--log-level beats both", []string{"--log-level=trace"}, map[string]string{"PROFI_LOG_LEVEL": "error", "RUST_LOG": "warn"}, slog.LevelDebug - 4, false, ""},
		{"--log-level unknown", []string{"--log-level=loud"}, nil, 0, false, `--log-level: unknown log level "loud"`},
		{"PROFI_LOG_LEVEL unknown", nil, map[string]string{"PROFI_LOG_LEVEL": "profi=debug"}, 0, false, `PROFI_LOG_LEVEL: unknown log level`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.wantErr != "" {
				_ = mustFail(t, tc.args, tc.env, tc.wantErr)
				return
			}
			cfg, warns := mustParse(t, tc.args, tc.env)
			if cfg.LogLevel != tc.want {
				t.Errorf("level = %v, want %v", cfg.LogLevel, tc.want)
			}
			gotWarn := false
			for _, w := range warns {
				gotWarn = gotWarn || strings.Contains(w, "module filters are ignored")
			}
			if gotWarn != tc.wantWarn {
				t.Errorf("module filter warning = %v, want %v (warnings %q)", gotWarn, tc.wantWarn, warns)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"kernel-mode enum", []string{"--kernel-mode=all"}, nil, `--kernel-mode: "all" is not valid (want off, anonymous or full)`},
		{"probe-profile enum", []string{"--probe-profile=lite"}, nil, `--probe-profile: "lite" is not valid (want lean or full)`},
		{"refresh-interval zero", []string{"--refresh-interval=0"}, nil, "--refresh-interval: must be greater than 0 seconds, got 0"},
		{"gc-interval negative", []string{"--gc-interval=-1"}, nil, "--gc-interval: must be greater than 0 seconds, got -1"},
		{"nvml-interval zero", []string{"--nvml-interval=0"}, nil, "--nvml-interval: must be greater than 0 seconds"},
		{"gpm bad", []string{"--gpm=maybe"}, nil, "--gpm"},
		{"probe-traced-processes bad", []string{"--probe-traced-processes=sometimes"}, nil, "--probe-traced-processes"},
		{"kernel-log bad", []string{"--kernel-log=on"}, nil, "--kernel-log"},
		{"gpm-interval zero", []string{"--gpm-interval=0"}, nil, "--gpm-interval: must be greater than 0 seconds"},
		{"nvml-interval zero even when disabled", []string{"--nvml-interval=0", "--disable-nvml"}, nil, "--nvml-interval: must be greater than 0"},
		{"report-interval negative", []string{"--report-interval=-1"}, nil, "--report-interval: must be at least 0 seconds, got -1"},
		{"nccl-hang-timeout negative", []string{"--nccl-hang-timeout=-1"}, nil, "--nccl-hang-timeout: must be at least 0 seconds"},
		{"crash-window negative", []string{"--crash-window=-1"}, nil, "--crash-window: must be at least 0 seconds, got -1"},
		{"quarantine-lift negative", []string{"--quarantine-lift=-3"}, nil, "--quarantine-lift: must be at least 0 seconds, got -3"},
		{"seconds overflow", []string{"--gc-interval=9223372036"}, nil, "--gc-interval: must be at most 2147483647 seconds"},
		{"entries-size zero", []string{"--entries-size=0"}, nil, "--entries-size: must be from 1 to 16777216 entries, got 0"},
		{"aggregated-size negative", []string{"--aggregated-size=-5"}, nil, "--aggregated-size: must be from 1 to 16777216"},
		{"launch-agg-size too big", []string{"--launch-agg-size=16777217"}, nil, "--launch-agg-size: must be from 1 to 16777216"},
		{"malloc-sizes-size beyond uint32", []string{"--malloc-sizes-size=4294967296"}, nil, "--malloc-sizes-size: must be from 1 to 16777216"},
		{"max-time-series zero", []string{"--max-time-series=0"}, nil, "--max-time-series: must be at least 1, got 0"},
		{"max-streams-per-pid zero", []string{"--max-streams-per-pid=0"}, nil, "--max-streams-per-pid: must be at least 1"},
		{"max-kernels-per-pid zero", []string{"--max-kernels-per-pid=0"}, nil, "--max-kernels-per-pid: must be at least 1"},
		{"max-attached-files zero", []string{"--max-attached-files=0"}, nil, "--max-attached-files: must be at least 1"},
		{"sample-rate zero", []string{"--sample-rate=0"}, nil, "--sample-rate: must be at least 1"},
		{"overhead budget above 100", []string{"--overhead-budget=101"}, nil, "--overhead-budget: must be a percentage from 0 (off) to 100, got 101"},
		{"overhead budget from env", nil, map[string]string{"PROFI_OVERHEAD_BUDGET": "-1"}, "PROFI_OVERHEAD_BUDGET: must be a percentage"},
		{"pid negative", []string{"--pid=-1"}, nil, "--pid: must be 0 (all) or a PID, got -1"},
		{"listen without port", []string{"--listen=0.0.0.0"}, nil, `--listen: "0.0.0.0" is not a host:port address`},
		{"listen named port", []string{"--listen=:http"}, nil, `--listen: port "http" must be a number from 0 to 65535`},
		{"listen port too big", []string{"--listen=:65536"}, nil, `--listen: port "65536" must be a number`},
		{"listen port negative", []string{"--listen=:-1"}, nil, `--listen: port "-1" must be a number`},
		{"tls mode enum", []string{"--metrics-tls-mode=on"}, nil, `--metrics-tls-mode: "on" is not valid (want off, server or mtls)`},
		{"tls mode enum from env", nil, map[string]string{"PROFI_METRICS_TLS_MODE": "tls"}, `PROFI_METRICS_TLS_MODE: "tls" is not valid`},
		{"auth mode enum", []string{"--metrics-auth-mode=basic"}, nil, `--metrics-auth-mode: "basic" is not valid (want off, bearer or mtls-or-bearer)`},
		{"server tls needs cert", []string{"--metrics-tls-mode=server", "--metrics-tls-key=/k"}, nil, "--metrics-tls-mode=server needs --metrics-tls-cert"},
		{"server tls needs key", []string{"--metrics-tls-mode=server", "--metrics-tls-cert=/c"}, nil, "--metrics-tls-mode=server needs --metrics-tls-key"},
		{"mtls needs cert", []string{"--metrics-tls-mode=mtls", "--metrics-tls-key=/k", "--metrics-tls-client-ca=/ca"}, nil, "--metrics-tls-mode=mtls needs --metrics-tls-cert"},
		{"mtls needs client ca", []string{"--metrics-tls-mode=mtls", "--metrics-tls-cert=/c", "--metrics-tls-key=/k"}, nil, "--metrics-tls-mode=mtls needs --metrics-tls-client-ca"},
		{"mtls-or-bearer needs mtls (off)", []string{"--metrics-auth-mode=mtls-or-bearer"}, nil, `--metrics-auth-mode=mtls-or-bearer needs --metrics-tls-mode=mtls, got "off"`},
		{"mtls-or-bearer needs mtls (server)", []string{"--metrics-auth-mode=mtls-or-bearer", "--metrics-tls-mode=server", "--metrics-tls-cert=/c", "--metrics-tls-key=/k"}, nil, `needs --metrics-tls-mode=mtls, got "server"`},
		{"mtls with bearer rejected", []string{"--metrics-tls-mode=mtls", "--metrics-tls-cert=/c", "--metrics-tls-key=/k", "--metrics-tls-client-ca=/ca", "--metrics-auth-mode=bearer"}, nil, "use --metrics-auth-mode=mtls-or-bearer"},
		{"auth cache ttl negative", []string{"--metrics-auth-cache-ttl=-1"}, nil, "--metrics-auth-cache-ttl: must be at least 0 seconds"},
		{"auth cache size zero from env", nil, map[string]string{"PROFI_METRICS_AUTH_CACHE_SIZE": "0"}, "PROFI_METRICS_AUTH_CACHE_SIZE: must be at least 1, got 0"},
		{"auth cache size not a number", nil, map[string]string{"PROFI_METRICS_AUTH_CACHE_SIZE": "big"}, `PROFI_METRICS_AUTH_CACHE_SIZE: "big" is not an integer`},
		{"unknown flag", []string{"--no-such-flag"}, nil, "parse command line: unknown flag --no-such-flag"},
		{"positional argument", []string{"extra"}, nil, "parse command line: unexpected argument extra"},
		{"non-integer flag", []string{"--gc-interval=1m"}, nil, "parse command line: --gc-interval"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_ = mustFail(t, tc.args, tc.env, tc.wantErr)
		})
	}
}

func TestValidMetricsSecurity(t *testing.T) {
	t.Parallel()
	tls := []string{"--metrics-tls-cert=/c", "--metrics-tls-key=/k"}
	tests := []struct {
		name string
		args []string
	}{
		{"server, no auth", append([]string{"--metrics-tls-mode=server"}, tls...)},
		{"server with bearer", append([]string{"--metrics-tls-mode=server", "--metrics-auth-mode=bearer"}, tls...)},
		{"plain http with bearer", []string{"--metrics-auth-mode=bearer"}},
		{"mtls, no auth", append([]string{"--metrics-tls-mode=mtls", "--metrics-tls-client-ca=/ca"}, tls...)},
		{"mtls-or-bearer", append([]string{"--metrics-tls-mode=mtls", "--metrics-tls-client-ca=/ca", "--metrics-auth-mode=mtls-or-bearer"}, tls...)},
		{"bearer with authorization", []string{"--metrics-auth-mode=bearer", "--metrics-auth-authorize"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mustParse(t, tc.args, nil)
		})
	}
}

func TestIgnoredMaterialWarns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"cert with tls off", []string{"--metrics-tls-cert=/c"}, "--metrics-tls-mode=off: the TLS certificate"},
		{"client ca with server", []string{"--metrics-tls-mode=server", "--metrics-tls-cert=/c", "--metrics-tls-key=/k", "--metrics-tls-client-ca=/ca"}, "--metrics-tls-client-ca is ignored"},
		{"audience with auth off", []string{"--metrics-auth-audience=a"}, "--metrics-auth-audience is ignored"},
		{"authorize with auth off", []string{"--metrics-auth-authorize"}, "--metrics-auth-authorize is ignored"},
		{"client SANs with server", []string{"--metrics-tls-mode=server", "--metrics-tls-cert=/c", "--metrics-tls-key=/k", "--metrics-tls-allowed-client-sans=a"}, "--metrics-tls-allowed-client-sans is ignored"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, warns := mustParse(t, tc.args, nil)
			if len(warns) != 1 || !strings.Contains(warns[0], tc.want) {
				t.Errorf("warnings = %q, want one containing %q", warns, tc.want)
			}
		})
	}
}

func TestAllProblemsReportedAtOnce(t *testing.T) {
	t.Parallel()
	args := []string{
		"--kernel-mode=x", "--probe-profile=y", "--refresh-interval=0", "--entries-size=0",
		"--pid=-2", "--listen=nope", "--sample-rate=0", "--metrics-tls-mode=mtls", "--otlp-protocol=http/json",
	}
	env := map[string]string{"RUST_LOG": "loud", "PROFI_METRICS_AUTH_CACHE_TTL": "soon"}
	err := mustFail(t, args, env,
		"--kernel-mode", "--probe-profile", "--refresh-interval", "--entries-size", "--pid", "--listen",
		"--sample-rate", "needs --metrics-tls-cert", "needs --metrics-tls-key", "needs --metrics-tls-client-ca",
		"http/json", "RUST_LOG", "PROFI_METRICS_AUTH_CACHE_TTL")
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error is not an errors.Join: %T", err)
	}
	if n := len(joined.Unwrap()); n != 13 {
		t.Errorf("got %d errors, want 13:\n%v", n, err)
	}
}

func TestUnsupported(t *testing.T) {
	t.Parallel()
	tls := []string{"--metrics-tls-cert=/c", "--metrics-tls-key=/k", "--metrics-tls-client-ca=/ca"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // substrings, one per expected sentence; nil = nothing unsupported
	}{
		{"kernel-mode full", []string{"--kernel-mode=full"}, nil, nil},
		{"kernel-mode off", []string{"--kernel-mode=off"}, nil, nil},
		{"probe-profile full", []string{"--probe-profile=full"}, nil, nil},
		{"nvtx", []string{"--enable-nvtx-tracing"}, nil, nil},
		{"nvml-interval", []string{"--nvml-interval=10"}, nil, nil},
		{"disable-nvml", []string{"--disable-nvml"}, nil, nil},
		{"nccl-hang-timeout 0 (detection off) is honoured", []string{"--nccl-hang-timeout=0"}, nil, nil},
		{"sample-rate", []string{"--sample-rate=4"}, nil, nil},
		{"detailed-launches", []string{"--detailed-launches"}, nil, nil},
		{"otlp flag", []string{"--otlp-endpoint=http://c:4317"}, nil, nil},
		{"otlp env", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, nil},
		{"otlp settings without endpoint", []string{"--otlp-protocol=http", "--otlp-interval-secs=5"}, nil, nil},
		{"metrics tls", append([]string{"--metrics-tls-mode=mtls"}, tls...), nil, nil},
		{"metrics auth", []string{"--metrics-auth-mode=bearer"}, nil, nil},
		{"tls and auth", append([]string{"--metrics-tls-mode=mtls", "--metrics-auth-mode=mtls-or-bearer"}, tls...), nil, nil},
		{"supported settings", []string{"--max-kernels-per-pid=10", "--report-interval=5", "--kernel-mode=anonymous", "--pid=7"}, nil, nil},
		{"node name is a warning, not unsupported", nil, map[string]string{"NODE_NAME": "n"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, _ := mustParse(t, tc.args, tc.env)
			got := cfg.Unsupported()
			if len(got) != len(tc.want) {
				t.Fatalf("Unsupported() = %q, want %d sentences", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("Unsupported()[%d] = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// A node name turns pod enrichment on: no warning.
func TestNodeNameNoWarning(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{{"NODE_NAME": "gpu-7"}, nil} {
		if _, warns := mustParse(t, nil, env); len(warns) != 0 {
			t.Errorf("NODE_NAME %v: warnings = %q, want none", env, warns)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--help", "-h"} {
		t.Run(arg, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			// An invalid setting elsewhere must not hide the help.
			cfg, _, err := Parse([]string{"--kernel-mode=bogus", arg}, envOf(map[string]string{"RUST_LOG": "loud"}), WithOutput(&buf))
			if !errors.Is(err, ErrHelp) || cfg != nil {
				t.Fatalf("Parse(%s) = %v, %v; want nil, ErrHelp", arg, cfg, err)
			}
			for _, want := range []string{"Usage: profi", "--listen=ADDR", "-p, --pid", "--otlp-endpoint", "NODE_NAME",
				"PROFI_METRICS_AUTH_CACHE_SIZE", "default: 0.0.0.0:9401", "OTEL_METRIC_EXPORT_INTERVAL (milliseconds)"} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("help does not contain %q:\n%s", want, buf.String())
				}
			}
			var usage bytes.Buffer
			if err := Usage(&usage); err != nil {
				t.Fatalf("Usage: %v", err)
			}
			if usage.String() != buf.String() {
				t.Errorf("Usage() differs from --help:\n%s\n---\n%s", usage.String(), buf.String())
			}
		})
	}
	for _, arg := range []string{"--version", "-V"} {
		t.Run(arg, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			cfg, _, err := Parse([]string{arg}, nil, WithOutput(&buf), WithVersion("v1.2.3 (abc)"))
			if !errors.Is(err, ErrVersion) || cfg != nil {
				t.Fatalf("Parse(%s) = %v, %v; want nil, ErrVersion", arg, cfg, err)
			}
			if buf.String() != "v1.2.3 (abc)\n" {
				t.Errorf("version output = %q", buf.String())
			}
		})
	}
}

// --metrics-tls-allowed-client-sans (Addition): a comma-separated list from
// the flag or PROFI_METRICS_TLS_ALLOWED_CLIENT_SANS, blanks dropped.
func TestAllowedClientSANs(t *testing.T) {
	t.Parallel()
	mtls := []string{"--metrics-tls-mode=mtls", "--metrics-tls-cert=/c", "--metrics-tls-key=/k", "--metrics-tls-client-ca=/ca"}
	want := []string{"prometheus.monitoring.svc", "spiffe://cluster.local/ns/monitoring/sa/prometheus", "10.1.2.3"}
	list := " prometheus.monitoring.svc, spiffe://cluster.local/ns/monitoring/sa/prometheus,,10.1.2.3 "
	cfg, _ := mustParse(t, append(mtls, "--metrics-tls-allowed-client-sans="+list), nil)
	if !slices.Equal(cfg.MetricsTLS.AllowedClientSANs, want) {
		t.Errorf("flag: %q, want %q", cfg.MetricsTLS.AllowedClientSANs, want)
	}
	cfg, _ = mustParse(t, mtls, map[string]string{"PROFI_METRICS_TLS_ALLOWED_CLIENT_SANS": list})
	if !slices.Equal(cfg.MetricsTLS.AllowedClientSANs, want) {
		t.Errorf("env: %q, want %q", cfg.MetricsTLS.AllowedClientSANs, want)
	}
	if cfg, _ = mustParse(t, mtls, nil); cfg.MetricsTLS.AllowedClientSANs != nil {
		t.Errorf("default: %q, want none", cfg.MetricsTLS.AllowedClientSANs)
	}
}
