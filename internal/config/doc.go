// Package config turns profi's command line and environment into a validated Config.
//
// It owns the user-facing contract of docs/INTERFACE.md sections 2 and 3: every flag name, default and
// environment variable, the OTLP precedence and unit rules (2.4), the /metrics TLS and
// authentication combination rules (2.5) and the log level (RUST_LOG, PROFI_LOG_LEVEL).
//
// Precedence is the same for every setting: a flag given on the command line wins over its
// environment variable, which wins over the default. Blank environment variables count as unset.
// The OTLP settings add the OpenTelemetry rules on top: OTEL_EXPORTER_OTLP_METRICS_* win over the
// generic OTEL_EXPORTER_OTLP_* forms, OTEL_METRIC_EXPORT_INTERVAL and OTEL_EXPORTER_OTLP_TIMEOUT are
// milliseconds while the flags are seconds, and a generic http/protobuf endpoint gets /v1/metrics.
//
// Parse reports every validation problem at once (errors.Join) and never exits the process:
// --help and --version print to the writer given with WithOutput (default os.Stdout) and return
// ErrHelp or ErrVersion, which main treats as a successful exit. Unsupported lists settings that
// parse and validate but whose feature has not landed yet, so main can refuse or warn.
//
// The package must not do I/O beyond printing help and version: it does not open certificate files,
// resolve hosts or read the process environment itself (the caller passes getenv), so tests and
// other packages can build a Config without side effects.
package config
