// Package kbugs is the table of kernel uprobe bugs that can hurt a probed
// process, and the classifier of the running kernel against it. The table
// is the one source: docs/KERNELS.md's "Known uprobe bugs" section is
// generated from it (`go test ./internal/kbugs -run TestDoc -update`; the
// test fails when it is stale). A kernel is known bad when its version lies in a bug's
// affected range and no release there carries the fix; suspect when a
// bug's range holds it but a stable or vendor backport may (profi cannot
// see backports from a version string): start-up warns.
package kbugs

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Verdict is what the classifier says of a kernel.
type Verdict string

const (
	// Good: no bug of the table applies.
	Good Verdict = "good"
	// Suspect: a bug applies unless a backport fixed it; a warning.
	Suspect Verdict = "suspect"
	// Bad: a bug applies; no probes unless --allow-unsafe-kernel.
	Bad Verdict = "bad"
)

// Version is an upstream kernel version.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less orders versions.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// Range is [From, To): the versions a bug affects. To zero: no release
// known to carry the fix.
type Range struct {
	From, To Version
	// Verdict for a kernel in the range: Bad when the fix is known to be
	// missing there, Suspect when a backport may carry it.
	Verdict Verdict
}

// Bug is one row of the table.
type Bug struct {
	ID   string // short name, shown by profi check and the start-up log
	Arch string // "arm64", "amd64", "" for both (Go's GOARCH names)
	// What goes wrong for a probed process, and how profi meets it.
	Harm string
	// Introduced and Fixed name the upstream commits (12 hex digits) or
	// the release that carries them; Fixed empty: no fix upstream.
	Introduced, Fixed string
	Ranges            []Range
}

// Table is every known uprobe bug that can hurt a probed process.
var Table = []Bug{
	{
		ID: "arm64-gcs-branch-truncation", Arch: "arm64",
		Harm:       "GCS support for simulated BL/BLR/RET truncated branch targets to 32 bits: a probed process resumes at a wrong address (SIGSEGV or worse).",
		Introduced: "efb07ac534e2", Fixed: "ea87c5536aa8 (same 6.18 merge window: no release has the first alone; a vendor kernel that backported only efb07ac534e2 is dangerous, and profi cannot see that)",
		Ranges: []Range{{From: Version{6, 18, 0}, To: Version{6, 18, 0}, Verdict: Bad}},
	},
	{
		ID: "arm64-debug-exception-rework", Arch: "arm64",
		Harm:       "The 6.17 rework of arm64 debug exceptions broke the uprobe single-step path until ea0d55ae4b32: probes on stepped instructions (most function entries) can mis-resume the probed process.",
		Introduced: "6.17 (debug-exception rework)", Fixed: "ea0d55ae4b32 (in 6.18; 6.17-stable and the 6.12-stable backport of the rework: only with it)",
		Ranges: []Range{{From: Version{6, 17, 0}, To: Version{6, 18, 0}, Verdict: Bad}},
	},
	{
		ID: "arm64-ldr-literal", Arch: "arm64",
		Harm:       "Uprobes on LDR (literal) were simulated wrongly (CVE-2024-50099): the probed process loads a wrong value. Support was removed in 6.12 and stable. profi never places a probe on a literal load (attach/uprobe/arm64.go offers only entry instructions it decodes), so this hurts only other tools' probes.",
		Introduced: "arm64 uprobe support (4.10)", Fixed: "6.12 and stable (CVE-2024-50099)",
		Ranges: []Range{{From: Version{4, 10, 0}, To: Version{6, 12, 0}, Verdict: Suspect}},
	},
	{
		ID: "arm64-traced-single-step", Arch: "arm64",
		Harm:       "A debugger single-stepping a thread that earlier hit a simulated uprobe hits a WARN in uprobe_single_step_handler and the process can resume at a wrong PC (seen on 6.14, GB300). No upstream fix found: profi watches the kernel log and stops every probe on such a warning.",
		Introduced: "unknown", Fixed: "",
		Ranges: []Range{{From: Version{4, 10, 0}, Verdict: Suspect}},
	},
	{
		ID: "x86-uretprobe-syscall-seccomp", Arch: "amd64",
		Harm:       "From 6.11 a return probe returns through the uretprobe system call; a process whose seccomp filter does not allow it (filters written before 6.11, e.g. container runtimes' default profiles) is killed with SIGSYS at the probed function's return. Fixed when seccomp let the call pass unfiltered; stable series got it at different releases.",
		Introduced: "6.11 (uretprobe syscall)", Fixed: "seccomp: passthrough uretprobe systemcall without filtering (6.14 and stable)",
		Ranges: []Range{{From: Version{6, 11, 0}, To: Version{6, 14, 0}, Verdict: Suspect}},
	},
}

// Kernel is what the classifier knows of the running kernel.
type Kernel struct {
	// Release and Version are uname's (-r and -v).
	Release, Version string
	Arch             string // GOARCH
}

// Finding is one bug that applies.
type Finding struct {
	Bug     Bug
	Verdict Verdict
}

// Result is the classification.
type Result struct {
	Verdict Verdict
	// Upstream is the upstream version the kernel was read as; Source
	// says from what ("release", "Debian version string").
	Upstream Version
	Source   string
	Findings []Finding
	// Err: the version could not be read (Verdict Suspect).
	Err error
}

// Classify classifies a kernel against the table.
func Classify(k Kernel) Result {
	v, source, err := Upstream(k)
	if err != nil {
		return Result{Verdict: Suspect, Err: err}
	}
	r := Result{Verdict: Good, Upstream: v, Source: source}
	for _, b := range Table {
		if b.Arch != "" && b.Arch != k.Arch {
			continue
		}
		for _, rg := range b.Ranges {
			if v.Less(rg.From) || (rg.To != (Version{}) && !v.Less(rg.To)) {
				continue
			}
			r.Findings = append(r.Findings, Finding{Bug: b, Verdict: rg.Verdict})
			if rg.Verdict == Bad || r.Verdict == Good {
				r.Verdict = rg.Verdict
			}
		}
	}
	return r
}

// Upstream reads the upstream version of a kernel. Debian's release
// (6.1.0-27-amd64) names only the ABI: its version string ("#1 SMP
// PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)") names the upstream
// stable release it is built from. Other distributions' releases
// (Ubuntu 6.8.0-45-generic, RHEL 5.14.0-427.el9) carry backports a
// version cannot show: read as the release's own numbers.
func Upstream(k Kernel) (Version, string, error) {
	if i := strings.Index(k.Version, " Debian "); i >= 0 {
		s := k.Version[i+len(" Debian "):]
		if j := strings.IndexAny(s, " -+~"); j >= 0 {
			s = s[:j]
		}
		if v, err := parse(s); err == nil {
			return v, "Debian version string", nil
		}
	}
	s := k.Release
	if j := strings.IndexAny(s, "-+~_"); j >= 0 {
		s = s[:j]
	}
	v, err := parse(s)
	if err != nil {
		return Version{}, "", fmt.Errorf("kernel release %q: %w", k.Release, err)
	}
	return v, "release", nil
}

func parse(s string) (Version, error) {
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, fmt.Errorf("not a version: %q", s)
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return Version{}, fmt.Errorf("not a version: %q", s)
		}
		n[i] = x
	}
	return Version{n[0], n[1], n[2]}, nil
}

// Summary is one line for a log or profi check.
func (r Result) Summary() string {
	if r.Err != nil {
		return "kernel version unreadable (" + r.Err.Error() + "): not classified"
	}
	if len(r.Findings) == 0 {
		return fmt.Sprintf("upstream %s (from the %s): no known uprobe bug that hurts a probed process", r.Upstream, r.Source)
	}
	var ids []string
	for _, f := range r.Findings {
		ids = append(ids, f.Bug.ID+" ("+string(f.Verdict)+")")
	}
	return fmt.Sprintf("upstream %s (from the %s): %s; docs/KERNELS.md, \"Known uprobe bugs\"", r.Upstream, r.Source, strings.Join(ids, ", "))
}

// Markdown renders the table for docs/KERNELS.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| Bug | Architecture | Affected (upstream) | Verdict | Introduced | Fixed | What it does to a probed process |\n|---|---|---|---|---|---|---|\n")
	for _, bug := range Table {
		arch := bug.Arch
		if arch == "" {
			arch = "all"
		}
		var rs []string
		var vs []string
		for _, r := range bug.Ranges {
			to := "no fix"
			if r.To != (Version{}) {
				to = "< " + r.To.String()
			}
			if r.From == r.To {
				to = "no release (vendor backports only)"
			}
			rs = append(rs, r.From.String()+" … "+to)
			vs = append(vs, string(r.Verdict))
		}
		fixed := bug.Fixed
		if fixed == "" {
			fixed = "none upstream"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s |\n", bug.ID, arch, strings.Join(rs, "; "), strings.Join(vs, "; "), bug.Introduced, fixed, bug.Harm)
	}
	return b.String()
}

// Running describes the kernel this process runs on.
func Running() Kernel {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Kernel{Arch: runtime.GOARCH}
	}
	return Kernel{Release: unix.ByteSliceToString(u.Release[:]), Version: unix.ByteSliceToString(u.Version[:]), Arch: runtime.GOARCH}
}
