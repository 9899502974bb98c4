// Package kbugs is the table of kernel uprobe bugs that can hurt a probed
// process, and the classifier of the running kernel against it. The table
// is the one source: docs/KERNELS.md's "Known uprobe bugs" section is
// generated from it (`go test ./internal/kbugs -run TestDoc -update`; the
// test fails when it is stale). Each row is evidence: the upstream commits
// that introduced and fixed the bug (with their first releases), the
// stable releases that carry the fix, what the bug does to a probed
// process, and where that is written. A kernel is affected when its
// upstream version lies between the two commits' releases and its stable
// series has no release with the fix up to it; the row's verdict then
// says what profi does: refuse to probe (bad), probe without the feature
// the bug needs (degraded), or warn (suspect). profi cannot see vendor
// backports in a version string: `profi check` runs the experiment where
// one exists.
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
	// Degraded: a bug applies and profi avoids it by giving up what the
	// bug needs (the finding's Downgrade): probes attach without it.
	Degraded Verdict = "degraded"
	// Suspect: a bug may apply (or the version is unreadable); a warning.
	Suspect Verdict = "suspect"
	// Bad: a bug applies; no probes unless --allow-unsafe-kernel.
	Bad Verdict = "bad"
)

// severity orders verdicts: a result has its worst finding's.
var severity = map[Verdict]int{Good: 0, Degraded: 1, Suspect: 2, Bad: 3}

// Downgrade is what profi gives up on a kernel with a bug it avoids.
type Downgrade string

const (
	// NoReturnProbes: no return probes (uretprobes). A call the agent
	// would time with an entry and a return probe is not probed; calls
	// counted at entry (launches with --kernel-mode anonymous, NVTX,
	// ncclGroupStart, the loader hook) still are.
	NoReturnProbes Downgrade = "no_return_probes"
)

// Version is an upstream kernel version.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// release names the version as kernel.org does: 6.11 for 6.11.0.
func (v Version) release() string {
	if v.Patch == 0 {
		return fmt.Sprintf("%d.%d", v.Major, v.Minor)
	}
	return v.String()
}

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

// Commit is an upstream (torvalds/linux) commit.
type Commit struct {
	ID      string // 12 hex digits
	Subject string
	// Release is the first upstream release that has the commit.
	Release Version
}

// Bug is one row of the table.
type Bug struct {
	ID   string // short name, shown by profi check and the start-up log
	Arch string // "arm64", "amd64", "" for both (Go's GOARCH names)
	// Harm is what the bug does to a probed process, as the sources show it.
	Harm string
	// Introduced and Fixed are the upstream commits; Fixed zero: no fix
	// upstream.
	Introduced, Fixed Commit
	// Stable are the stable releases that carry the fix, one per stable
	// series that got it (6.12.14 for 6.12.y): from there on the series
	// is fixed. A series not listed has no release with the fix.
	Stable []Version
	// Verdict for an affected kernel: Bad, Degraded (with Downgrade) or
	// Suspect.
	Verdict   Verdict
	Downgrade Downgrade
	// Avoided, when set, says why the bug cannot hurt a process profi
	// probes (profi never places the probe it needs): the row documents
	// the bug and never applies.
	Avoided string
	// Sources: where the commits, the stable releases and the harm are
	// written (kernel.org, lore, CVE records).
	Sources []string
}

// Affects reports whether the upstream version v has the bug.
func (b Bug) Affects(v Version) bool {
	if v.Less(b.Introduced.Release) {
		return false
	}
	if b.Fixed.Release != (Version{}) && !v.Less(b.Fixed.Release) {
		return false
	}
	for _, s := range b.Stable {
		if s.Major == v.Major && s.Minor == v.Minor && !v.Less(s) {
			return false
		}
	}
	return true
}

// Table is every known uprobe bug that can hurt a probed process. Rows
// whose harm no source shows are not here (docs/KERNELS.md, "Known uprobe
// bugs", says which were removed and why).
var Table = []Bug{
	{
		ID: "x86-uretprobe-syscall-seccomp", Arch: "amd64",
		Harm: "From 6.11 a return probe on x86-64 returns through the uretprobe system call, which seccomp filtered like any other: " +
			"a process whose filter does not allow it (allow-lists written before 6.11: Docker's and other container runtimes' default profiles, " +
			"systemd's SystemCallFilter=) is killed at the probed function's return, with SIGSEGV where the filter answers an error " +
			"(the trampoline, its call refused, returns to a wrong address) or SIGSYS where it kills.",
		Introduced: Commit{ID: "ff474a78cef5", Subject: "uprobe: Add uretprobe syscall to speed up return probe", Release: Version{6, 11, 0}},
		Fixed:      Commit{ID: "cf6cb56ef244", Subject: "seccomp: passthrough uretprobe systemcall without filtering", Release: Version{6, 14, 0}},
		// 6.11.y ended at 6.11.11 (December 2024) without it.
		Stable:    []Version{{6, 12, 14}, {6, 13, 3}},
		Verdict:   Degraded,
		Downgrade: NoReturnProbes,
		Sources: []string{
			"https://git.kernel.org/torvalds/c/cf6cb56ef244",
			"https://lore.kernel.org/lkml/20250117005539.325887-1-eyal.birger@gmail.com/ (reproducer: a process under an allow-list filter dies at a uretprobe)",
			"https://lore.kernel.org/stable/20250213142443.840424031@linuxfoundation.org/ (6.12.14-rc1, patch 189/422)",
			"https://lore.kernel.org/stable/2025021754-stimuli-duly-4353@gregkh/ (Linux 6.13.3)",
			"https://www.cve.org/CVERecord?id=CVE-2025-21834",
		},
	},
	{
		ID: "arm64-ldr-literal", Arch: "arm64",
		Harm: "A uprobe on an LDR (literal) or LDRSW (literal) was simulated with plain kernel accesses to user memory, which fault under PAN " +
			"(hardware from ARMv8.1, or software PAN): a hit is a kernel BUG() that kills the probed task and can lock up or panic the node.",
		Introduced: Commit{ID: "9842ceae9fa8", Subject: "arm64: Add uprobe support", Release: Version{4, 10, 0}},
		Fixed:      Commit{ID: "acc450aa0709", Subject: "arm64: probes: Remove broken LDR (literal) uprobe support", Release: Version{6, 12, 0}},
		Stable:     []Version{{4, 19, 323}, {5, 4, 285}, {5, 10, 228}, {5, 15, 169}, {6, 1, 114}, {6, 6, 58}, {6, 11, 5}},
		Avoided: "profi never probes a literal load: its arm64 placement refuses a function whose first instruction is one, " +
			"on every kernel (internal/attach/uprobe/arm64.go, RefusedLiteralLoad)",
		Sources: []string{
			"https://git.kernel.org/torvalds/c/acc450aa0709",
			"https://osv.dev/vulnerability/CVE-2024-50099 (fixed-in stable releases)",
		},
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
	// Verdict is the worst of the findings' (Good without any).
	Verdict Verdict
	// Upstream is the upstream version the kernel was read as; Source
	// says from what ("release", "Debian version string").
	Upstream Version
	Source   string
	Findings []Finding
	// Err: the version could not be read (Verdict Suspect, no downgrade).
	Err error
}

// NoReturnProbes reports whether the agent must attach no return probe
// on this kernel (a finding with the NoReturnProbes downgrade).
func (r Result) NoReturnProbes() bool { return r.downgraded(NoReturnProbes) }

func (r Result) downgraded(d Downgrade) bool {
	for _, f := range r.Findings {
		if f.Bug.Downgrade == d {
			return true
		}
	}
	return false
}

// Classify classifies a kernel against the table.
func Classify(k Kernel) Result { return classify(k, Table) }

func classify(k Kernel, table []Bug) Result {
	v, source, err := Upstream(k)
	if err != nil {
		return Result{Verdict: Suspect, Err: err}
	}
	r := Result{Verdict: Good, Upstream: v, Source: source}
	for _, b := range table {
		if b.Avoided != "" || (b.Arch != "" && b.Arch != k.Arch) || !b.Affects(v) {
			continue
		}
		r.Findings = append(r.Findings, Finding{Bug: b, Verdict: b.Verdict})
		if severity[b.Verdict] > severity[r.Verdict] {
			r.Verdict = b.Verdict
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
		what := string(f.Verdict)
		if f.Bug.Downgrade != "" {
			what += ": " + string(f.Bug.Downgrade)
		}
		ids = append(ids, f.Bug.ID+" ("+what+")")
	}
	return fmt.Sprintf("upstream %s (from the %s): %s; docs/KERNELS.md, \"Known uprobe bugs\"", r.Upstream, r.Source, strings.Join(ids, ", "))
}

// Markdown renders the table for docs/KERNELS.md.
func Markdown() string { return markdown(Table) }

func markdown(table []Bug) string {
	var b strings.Builder
	b.WriteString("| Bug | Architecture | Affected (upstream) | Fixed in stable | Verdict | Introduced | Fixed | What it does to a probed process | Sources |\n" +
		"|---|---|---|---|---|---|---|---|---|\n")
	for _, bug := range table {
		arch := bug.Arch
		if arch == "" {
			arch = "all"
		}
		affected := bug.Introduced.Release.release() + " … "
		fixed := "none upstream"
		if bug.Fixed.Release != (Version{}) {
			affected += "< " + bug.Fixed.Release.release()
			fixed = commit(bug.Fixed)
		} else {
			affected += "no fix"
		}
		var stable []string
		for _, s := range bug.Stable {
			stable = append(stable, s.String())
		}
		if len(stable) == 0 {
			stable = []string{"none"}
		}
		verdict := string(bug.Verdict)
		if bug.Downgrade != "" {
			verdict += " (" + string(bug.Downgrade) + ")"
		}
		if bug.Avoided != "" {
			verdict = "never applies: " + bug.Avoided
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n", bug.ID, arch, affected, strings.Join(stable, ", "),
			verdict, commit(bug.Introduced), fixed, bug.Harm, strings.Join(bug.Sources, "<br>"))
	}
	return b.String()
}

// commit renders a commit for the table.
func commit(c Commit) string {
	return fmt.Sprintf("`%s` %s (%s)", c.ID, c.Subject, c.Release.release())
}

// Running describes the kernel this process runs on.
func Running() Kernel {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Kernel{Arch: runtime.GOARCH}
	}
	return Kernel{Release: unix.ByteSliceToString(u.Release[:]), Version: unix.ByteSliceToString(u.Version[:]), Arch: runtime.GOARCH}
}
