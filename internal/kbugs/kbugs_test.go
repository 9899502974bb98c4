package kbugs

import (
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/KERNELS.md's table")

const uretprobeSeccomp = "x86-uretprobe-syscall-seccomp"

func TestClassify(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		k         Kernel
		want      Verdict
		up        string
		source    string
		reasons   []string
		noReturns bool
	}{
		{"debian bookworm amd64", Kernel{"6.1.0-27-amd64", "#1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)", "amd64"}, Good, "6.1.115", "Debian version string", nil, false},
		{"debian trixie amd64", Kernel{"6.12.43+deb13-amd64", "#1 SMP PREEMPT_DYNAMIC Debian 6.12.43-1 (2025-08-27)", "amd64"}, Good, "6.12.43", "Debian version string", nil, false},
		{"debian trixie cloud amd64", Kernel{"6.12.117+deb13-cloud-amd64", "#1 SMP PREEMPT_DYNAMIC Debian 6.12.117-1 (2026-10-01)", "amd64"}, Good, "6.12.117", "Debian version string", nil, false},
		{"debian 6.12 before the backport", Kernel{"6.12.12-amd64", "#1 SMP PREEMPT_DYNAMIC Debian 6.12.12-1 (2025-02-02)", "amd64"}, Degraded, "6.12.12", "Debian version string", []string{uretprobeSeccomp}, true},
		{"debian 6.12 before the backport on arm64", Kernel{"6.12.12-arm64", "#1 SMP Debian 6.12.12-1 (2025-02-02)", "arm64"}, Good, "6.12.12", "Debian version string", nil, false},
		{"ubuntu 6.11 release read as is", Kernel{"6.11.0-19-generic", "#19-Ubuntu SMP PREEMPT_DYNAMIC", "amd64"}, Degraded, "6.11.0", "release", []string{uretprobeSeccomp}, true},
		{"ubuntu 6.8 arm64", Kernel{"6.8.0-45-generic-64k", "#45-Ubuntu SMP", "arm64"}, Good, "6.8.0", "release", nil, false},
		{"upstream 6.14 amd64", Kernel{"6.14.2", "#1 SMP", "amd64"}, Good, "6.14.2", "release", nil, false},
		{"this machine's 6.18 amd64", Kernel{"6.18.0", "#1 SMP", "amd64"}, Good, "6.18.0", "release", nil, false},
		{"arm64 6.17", Kernel{"6.17.3-arch1", "#1 SMP", "arm64"}, Good, "6.17.3", "release", nil, false},
		{"arm64 6.1 debian before the ldr fix", Kernel{"6.1.0-26-cloud-arm64", "#1 SMP Debian 6.1.112-1 (2024-09-30)", "arm64"}, Good, "6.1.112", "Debian version string", nil, false},
		{"rhel release read as is", Kernel{"5.14.0-427.el9.x86_64", "#1 SMP PREEMPT_DYNAMIC", "amd64"}, Good, "5.14.0", "release", nil, false},
		{"two-part release", Kernel{"6.13", "", "amd64"}, Degraded, "6.13.0", "release", []string{uretprobeSeccomp}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := Classify(tc.k)
			if r.Err != nil || r.Verdict != tc.want || r.Upstream.String() != tc.up || r.Source != tc.source ||
				!slices.Equal(ids(r), tc.reasons) || r.NoReturnProbes() != tc.noReturns {
				t.Errorf("Classify(%+v) = %s %s (%s) %v no-returns %v, err %v; want %s %s (%s) %v no-returns %v",
					tc.k, r.Verdict, r.Upstream, r.Source, ids(r), r.NoReturnProbes(), r.Err, tc.want, tc.up, tc.source, tc.reasons, tc.noReturns)
			}
		})
	}
	if r := Classify(Kernel{Release: "weird", Arch: "amd64"}); r.Verdict != Suspect || r.Err == nil || r.NoReturnProbes() {
		t.Errorf("unreadable release: %+v", r)
	}
}

func ids(r Result) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Bug.ID)
	}
	return out
}

func bug(t *testing.T, id string) Bug {
	t.Helper()
	for _, b := range Table {
		if b.ID == id {
			return b
		}
	}
	t.Fatalf("no row %s", id)
	return Bug{}
}

// TestBoundaries: each row's first affected and first fixed release, per
// stable series, on its architecture, and the downgrade it asks for.
func TestBoundaries(t *testing.T) {
	t.Parallel()
	cases := []struct {
		bug      string
		release  string
		affected bool
	}{
		// Introduced in 6.11 (ff474a78cef5), fixed upstream in 6.14
		// (cf6cb56ef244); 6.12.14 and 6.13.3 carry the backport, 6.11.y
		// never got it.
		{uretprobeSeccomp, "6.10.14", false},
		{uretprobeSeccomp, "6.11", true},
		{uretprobeSeccomp, "6.11.11", true},
		{uretprobeSeccomp, "6.12", true},
		{uretprobeSeccomp, "6.12.13", true},
		{uretprobeSeccomp, "6.12.14", false},
		{uretprobeSeccomp, "6.12.60", false},
		{uretprobeSeccomp, "6.13.2", true},
		{uretprobeSeccomp, "6.13.3", false},
		{uretprobeSeccomp, "6.14", false},
		{uretprobeSeccomp, "6.18.44", false},
		// Since 4.10 (9842ceae9fa8), fixed in 6.12 (acc450aa0709) and in
		// seven stable series (CVE-2024-50099); 6.2.y to 6.5.y, 6.7.y to
		// 6.10.y had ended.
		{"arm64-ldr-literal", "4.9.337", false},
		{"arm64-ldr-literal", "4.10", true},
		{"arm64-ldr-literal", "4.19.322", true},
		{"arm64-ldr-literal", "4.19.323", false},
		{"arm64-ldr-literal", "5.4.284", true},
		{"arm64-ldr-literal", "5.4.285", false},
		{"arm64-ldr-literal", "5.10.227", true},
		{"arm64-ldr-literal", "5.10.228", false},
		{"arm64-ldr-literal", "5.15.168", true},
		{"arm64-ldr-literal", "5.15.169", false},
		{"arm64-ldr-literal", "6.1.113", true},
		{"arm64-ldr-literal", "6.1.114", false},
		{"arm64-ldr-literal", "6.6.57", true},
		{"arm64-ldr-literal", "6.6.58", false},
		{"arm64-ldr-literal", "6.8.12", true},
		{"arm64-ldr-literal", "6.11.4", true},
		{"arm64-ldr-literal", "6.11.5", false},
		{"arm64-ldr-literal", "6.12", false},
	}
	for _, tc := range cases {
		t.Run(tc.bug+" "+tc.release, func(t *testing.T) {
			t.Parallel()
			v, err := parse(tc.release)
			if err != nil {
				t.Fatal(err)
			}
			if got := bug(t, tc.bug).Affects(v); got != tc.affected {
				t.Errorf("%s affects %s = %v, want %v", tc.bug, v, got, tc.affected)
			}
		})
	}
}

// TestUretprobeSeccompDowngrade: on an affected x86-64 kernel the agent
// keeps probing, without return probes; on arm64 (no uretprobe syscall),
// or once the series has the fix, nothing is given up.
func TestUretprobeSeccompDowngrade(t *testing.T) {
	t.Parallel()
	r := Classify(Kernel{Release: "6.12.13", Arch: "amd64"})
	if r.Verdict != Degraded || !r.NoReturnProbes() || len(r.Findings) != 1 || r.Findings[0].Verdict != Degraded {
		t.Fatalf("6.12.13 amd64: %+v", r)
	}
	if s := r.Summary(); !strings.Contains(s, uretprobeSeccomp+" (degraded: no_return_probes)") {
		t.Errorf("summary %q does not name the downgrade", s)
	}
	for _, k := range []Kernel{{Release: "6.12.13", Arch: "arm64"}, {Release: "6.12.14", Arch: "amd64"}} {
		if r := Classify(k); r.NoReturnProbes() || r.Verdict != Good {
			t.Errorf("%+v: %+v, want good with return probes", k, r)
		}
	}
}

// TestAvoided: a row profi's probe placement avoids is documented but
// never a finding, whatever the version.
func TestAvoided(t *testing.T) {
	t.Parallel()
	b := bug(t, "arm64-ldr-literal")
	if b.Avoided == "" || !b.Affects(Version{6, 1, 113}) {
		t.Fatalf("arm64-ldr-literal: %+v", b)
	}
	if r := Classify(Kernel{Release: "6.1.113", Arch: "arm64"}); r.Verdict != Good || len(r.Findings) != 0 {
		t.Errorf("arm64 6.1.113: %+v", r)
	}
}

// TestBad: the refusal path. A bad row makes the kernel bad and wins
// over a degraded one, whose downgrade still holds; a suspect one wins
// over degraded too. Injected tables: the real one has no bad row today.
func TestBad(t *testing.T) {
	t.Parallel()
	bad := Bug{ID: "test-bad", Arch: "amd64", Harm: "kills it", Verdict: Bad,
		Introduced: Commit{ID: "000000000001", Subject: "break", Release: Version{6, 11, 0}},
		Fixed:      Commit{ID: "000000000002", Subject: "mend", Release: Version{6, 15, 0}},
		Stable:     []Version{{6, 12, 30}}}
	suspect := bad
	suspect.ID, suspect.Verdict = "test-suspect", Suspect
	degraded := bug(t, uretprobeSeccomp)
	k := func(release string) Kernel {
		return Kernel{Release: release, Version: "#1 SMP PREEMPT_DYNAMIC Debian " + release + "-1 (2025-08-27)", Arch: "amd64"}
	}
	cases := []struct {
		name      string
		table     []Bug
		k         Kernel
		want      Verdict
		reasons   []string
		noReturns bool
	}{
		{"bad alone", []Bug{bad}, k("6.12.29"), Bad, []string{"test-bad"}, false},
		{"bad series fixed in stable", []Bug{bad}, k("6.12.30"), Good, nil, false},
		{"bad fixed upstream", []Bug{bad}, k("6.15.1"), Good, nil, false},
		{"bad on the other architecture", []Bug{bad}, Kernel{Release: "6.12.29", Arch: "arm64"}, Good, nil, false},
		{"bad over degraded", []Bug{degraded, bad}, k("6.12.13"), Bad, []string{uretprobeSeccomp, "test-bad"}, true},
		{"degraded under bad's fix", []Bug{degraded, bad}, k("6.13.1"), Bad, []string{uretprobeSeccomp, "test-bad"}, true},
		{"suspect over degraded", []Bug{suspect, degraded}, k("6.13.2"), Suspect, []string{"test-suspect", uretprobeSeccomp}, true},
		{"only bad left", []Bug{degraded, bad}, k("6.14.3"), Bad, []string{"test-bad"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := classify(tc.k, tc.table)
			if r.Verdict != tc.want || !slices.Equal(ids(r), tc.reasons) || r.NoReturnProbes() != tc.noReturns {
				t.Errorf("classify(%+v) = %s %v no-returns %v; want %s %v no-returns %v", tc.k, r.Verdict, ids(r), r.NoReturnProbes(), tc.want, tc.reasons, tc.noReturns)
			}
		})
	}
	if md := markdown([]Bug{bad, {ID: "open", Verdict: Suspect, Introduced: Commit{ID: "000000000003", Subject: "x", Release: Version{5, 4, 0}}}}); !strings.Contains(md, "| `test-bad` | amd64 | 6.11 … < 6.15 | 6.12.30 | bad |") ||
		!strings.Contains(md, "| `open` | all | 5.4 … no fix | none | suspect |") || !strings.Contains(md, "none upstream") {
		t.Errorf("markdown:\n%s", md)
	}
}

var commitID = regexp.MustCompile(`^[0-9a-f]{12}$`)

// TestTableEvidence: every row names both commits (12 hex digits, subject,
// first release, in order), stable releases between them one per series,
// what it does to a probed process, its sources, and a verdict profi can
// act on (a downgrade only with degraded).
func TestTableEvidence(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, b := range Table {
		if seen[b.ID] {
			t.Errorf("%s twice", b.ID)
		}
		seen[b.ID] = true
		if b.Harm == "" || len(b.Sources) == 0 || (b.Arch != "" && b.Arch != "amd64" && b.Arch != "arm64") {
			t.Errorf("%s: harm %q, sources %v, arch %q", b.ID, b.Harm, b.Sources, b.Arch)
		}
		for _, c := range []Commit{b.Introduced, b.Fixed} {
			if !commitID.MatchString(c.ID) || c.Subject == "" || c.Release == (Version{}) {
				t.Errorf("%s: commit %+v", b.ID, c)
			}
		}
		if !b.Introduced.Release.Less(b.Fixed.Release) {
			t.Errorf("%s: fixed in %s, not after %s", b.ID, b.Fixed.Release, b.Introduced.Release)
		}
		series := map[[2]int]bool{}
		for _, s := range b.Stable {
			if !b.Introduced.Release.Less(s) || !s.Less(b.Fixed.Release) || series[[2]int{s.Major, s.Minor}] {
				t.Errorf("%s: stable %s outside (%s, %s) or its series twice", b.ID, s, b.Introduced.Release, b.Fixed.Release)
			}
			series[[2]int{s.Major, s.Minor}] = true
			if b.Affects(s) || !b.Affects(Version{s.Major, s.Minor, s.Patch - 1}) {
				t.Errorf("%s: %s is not the series' first fixed release", b.ID, s)
			}
		}
		switch {
		case b.Avoided != "":
		case b.Verdict == Degraded && b.Downgrade != "":
		case (b.Verdict == Bad || b.Verdict == Suspect) && b.Downgrade == "":
		default:
			t.Errorf("%s: verdict %q with downgrade %q", b.ID, b.Verdict, b.Downgrade)
		}
	}
}

const docPath = "../../docs/KERNELS.md"
const begin, end = "<!-- kbugs table: generated by internal/kbugs (go test ./internal/kbugs -run TestDoc -update) -->\n", "<!-- end of kbugs table -->\n"

// TestDoc: docs/KERNELS.md's table is the Go table's rendering.
func TestDoc(t *testing.T) {
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the table markers", docPath)
	}
	got, want := s[i+len(begin):j], Markdown()
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(docPath, []byte(s[:i+len(begin)]+want+s[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's known-bug table is stale: go test ./internal/kbugs -run TestDoc -update", docPath)
}
