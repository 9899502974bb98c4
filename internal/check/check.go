// Package check is `profi check`: a preflight of everything the agent
// needs on this node (kernel features, privileges, a BPF program that
// really loads and a uprobe that really fires, a return probe that a
// process under a seccomp filter survives, procfs, NVML, the
// Kubernetes API and its RBAC, TLS files, the OTLP endpoint). Each check
// says ok, warn or fail, why, and the fix. A fail blocks: the agent would
// not start or would not profile.
package check

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/profi-dev/profi/internal/config"
)

// Status of one check.
type Status string

// Statuses, in increasing severity.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is the outcome of one check.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail is what was found (the why).
	Detail string `json:"detail"`
	// Fix says what to do; empty for ok.
	Fix string `json:"fix,omitempty"`
}

// Report is every result; OK is false when any check failed.
type Report struct {
	OK      bool     `json:"ok"`
	Results []Result `json:"checks"`
}

// Env is what the checks look at; tests replace parts of it.
type Env struct {
	Config *config.Config
	// ConfigErr is the agent configuration's validation error, if any.
	ConfigErr error
	Getenv    func(string) string
	// SysRoot is where /sys is ("/sys" on a node).
	SysRoot string
	// Pretend lists features to report absent whatever the kernel has
	// (hidden test knob: uprobe_multi, btf, uprobe_pmu,
	// uretprobe_syscall, tracepoints, bpf, nvml).
	Pretend map[string]bool
	// Timeout bounds each network check.
	Timeout time.Duration
}

func (e *Env) pretend(feature string) bool { return e.Pretend[feature] }

// Run runs every check in order.
func Run(ctx context.Context, env *Env) Report {
	var r Report
	add := func(res ...Result) { r.Results = append(r.Results, res...) }
	if env.ConfigErr != nil {
		add(Result{Name: "configuration", Status: Fail, Detail: strings.ReplaceAll(env.ConfigErr.Error(), "\n", "; "),
			Fix: "correct the flags and environment variables named above (profi --help lists them); the other checks use the defaults"})
	} else {
		add(Result{Name: "configuration", Status: OK, Detail: "flags and environment variables are valid"})
	}
	add(kernelChecks(env)...)
	caps := capabilityCheck(env)
	add(caps)
	add(memlockCheck(env)...)
	add(bpfCheck(env)...)
	add(procCheck(env))
	add(nvmlCheck(env))
	add(kubernetesChecks(ctx, env)...)
	add(tlsChecks(env)...)
	add(otlpCheck(ctx, env))
	r.OK = !slices.ContainsFunc(r.Results, func(x Result) bool { return x.Status == Fail })
	return r
}

// WriteText prints the report for people: one line per check, the fix
// under each warn and fail.
func WriteText(w io.Writer, r Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(string(res.Status)), res.Name, res.Detail)
		if res.Fix != "" && res.Status != OK {
			fmt.Fprintf(tw, "\t\tfix: %s\n", res.Fix)
		}
	}
	_ = tw.Flush()
	var fails, warns int
	for _, res := range r.Results {
		switch res.Status {
		case Fail:
			fails++
		case Warn:
			warns++
		}
	}
	if fails > 0 {
		fmt.Fprintf(w, "\n%d blocking problem(s), %d warning(s): profi cannot profile this node until the failures are fixed.\n", fails, warns)
	} else {
		fmt.Fprintf(w, "\nready: %d warning(s).\n", warns)
	}
}

// Main runs `profi check` with args (after the subcommand): its own flags
// (--output text|json, --timeout) and every agent flag, which it reads
// exactly as the agent does (env vars included), so it checks the files
// and endpoints the agent will use. Exit status 1 when a check failed, 2
// on a usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if os.Getenv(seccompChildEnv) != "" {
		// The uretprobe/seccomp experiment's child (seccomp.go): it exits
		// here, before the caller's clean-up runs on its confined thread.
		os.Exit(seccompChild())
	}
	own, rest, err := splitArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "profi check: %v\n", err)
		return 2
	}
	if own.help {
		fmt.Fprint(stdout, usage)
		return 0
	}
	env := &Env{Getenv: os.Getenv, SysRoot: "/sys", Timeout: own.timeout, Pretend: map[string]bool{}}
	for _, f := range strings.Split(own.pretend+","+os.Getenv("PROFI_CHECK_PRETEND_MISSING"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			env.Pretend[f] = true
		}
	}
	cfg, _, err := config.Parse(rest, os.Getenv, config.WithOutput(io.Discard))
	if err != nil {
		env.ConfigErr = err
		cfg = config.Default()
	}
	env.Config = cfg
	r := Run(ctx, env)
	if own.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	} else {
		WriteText(stdout, r)
	}
	if !r.OK {
		return 1
	}
	return 0
}

const usage = `Usage: profi check [--output text|json] [--timeout 5s] [agent flags...]

Checks that this node can run the profi agent with the given flags and
environment (the same as the agent's): kernel features, capabilities,
memory limits, a BPF program that loads and a uprobe that fires, procfs,
NVML, the Kubernetes API and RBAC, TLS files and the OTLP endpoint.
Exits 1 when a check fails, 0 otherwise.
`

type ownFlags struct {
	json, help bool
	timeout    time.Duration
	pretend    string
}

// splitArgs takes check's own flags out of args and leaves the agent's.
func splitArgs(args []string) (ownFlags, []string, error) {
	o := ownFlags{timeout: 5 * time.Second}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(a, "=")
		next := func() (string, error) {
			if hasVal {
				return val, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", name)
			}
			i++
			return args[i], nil
		}
		switch name {
		case "-h", "--help":
			o.help = true
		case "-o", "--output":
			v, err := next()
			if err != nil {
				return o, nil, err
			}
			switch v {
			case "json":
				o.json = true
			case "text":
				o.json = false
			default:
				return o, nil, fmt.Errorf("--output %q: want text or json", v)
			}
		case "--timeout":
			v, err := next()
			if err != nil {
				return o, nil, err
			}
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return o, nil, fmt.Errorf("--timeout %q: want a positive duration such as 5s", v)
			}
			o.timeout = d
		case "--pretend-missing": // hidden: tests force a feature off
			v, err := next()
			if err != nil {
				return o, nil, err
			}
			o.pretend = v
		default:
			rest = append(rest, a)
		}
	}
	return o, rest, nil
}
