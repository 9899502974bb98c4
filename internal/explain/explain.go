// Package explain is `profi explain PID|POD`: why a process is, or is not,
// profiled. It reads the running agent's /status (no API server needed)
// and, when the process runs on this machine, its own /proc/PID/maps, so
// it can tell "maps no CUDA library" from "excluded by --pid" from "not
// seen yet".
package explain

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/profi-dev/profi/internal/client"
	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/status"
)

// Verdicts, one per process.
const (
	VerdictAttached    = "attached"     // every mapped CUDA/NCCL library has probes
	VerdictPartial     = "partial"      // some mapped library failed to attach, or some probed functions are refused by the kernel
	VerdictNotAttached = "not_attached" // maps a library, none attached
	VerdictNotCUDA     = "not_cuda"     // maps no CUDA/NCCL library
	VerdictFiltered    = "filtered"     // excluded by the agent's --pid
	VerdictUnknown     = "unknown"      // neither the agent nor this machine knows it
	// VerdictQuarantined: a library it maps is in the crash breaker's
	// quarantine (its probes are off node-wide).
	VerdictQuarantined = "quarantined"
	// VerdictUnprobed: left unprobed on purpose, with no breakpoint in its
	// memory: a traced process (--probe-traced-processes).
	VerdictUnprobed = "unprobed"
)

// ReasonQuarantined is Library.Reason of a quarantined library file.
const ReasonQuarantined = "quarantined"

// Library is one CUDA/NCCL library file a process maps.
type Library struct {
	Library string `json:"library"`
	// Path is the path inside the process's mount namespace (container).
	Path     string `json:"path"`
	File     string `json:"file,omitempty"`
	Attached bool   `json:"attached"`
	// Probes are "symbol+offset" per probed function, "(+return)" when it
	// also has a return probe (timed).
	Probes  []string `json:"probes,omitempty"`
	Missing []string `json:"missing_symbols,omitempty"`
	// Refused are "symbol+offset (reason, file offset 0x…)" of probed
	// functions the kernel refuses a uprobe on: their calls are not counted.
	Refused     []string  `json:"refused_probes,omitempty"`
	UprobeMulti bool      `json:"uprobe_multi,omitempty"`
	Paused      bool      `json:"paused,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Error       string    `json:"error,omitempty"`
	Attempts    int       `json:"attempts,omitempty"`
	NextRetry   time.Time `json:"next_retry,omitzero"`
	AgentSeen   bool      `json:"seen_by_agent"`
	LocalMapped bool      `json:"mapped_here"`
}

// Process is the answer for one process.
type Process struct {
	PID       int       `json:"pid"`
	Comm      string    `json:"comm"`
	Verdict   string    `json:"verdict"`
	Why       string    `json:"why"`
	Libraries []Library `json:"libraries"`
	// Tracked: the agent's last scan saw it map an attached library.
	Tracked bool     `json:"tracked"`
	Pods    []string `json:"pods,omitempty"`
	// PerGPU is the agent's view of the process: labels, their sources and
	// live counters, one entry per GPU it used; empty while the agent has
	// no data for it.
	PerGPU []status.ProcessStatus `json:"per_gpu"`
	// Launch is the launch-bound verdict (LaunchVerdict) and LaunchWhy
	// its line; empty before a thread of the process launched a kernel.
	Launch    string `json:"launch,omitempty"`
	LaunchWhy string `json:"launch_why,omitempty"`
}

// Local reads this machine's procfs; Root "" means none (remote agent).
type Local struct{ Root string }

// mapped returns the CUDA/NCCL libraries pid maps and its comm; ok is
// false when the process does not exist here.
func (l Local) mapped(pid int) (libs map[string]discover.Library, comm string, ok bool) {
	if l.Root == "" {
		return nil, "", false
	}
	f, err := os.Open(filepath.Join(l.Root, strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil, "", false
	}
	defer f.Close()
	libs = map[string]discover.Library{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		e, hasFile, err := discover.ParseMapsLine(sc.Text())
		if err != nil || !hasFile {
			continue
		}
		if lib, ok := discover.Classify(e.Path); ok && lib != discover.LibLoader {
			libs[e.Path] = lib
		}
	}
	if b, err := os.ReadFile(filepath.Join(l.Root, strconv.Itoa(pid), "comm")); err == nil {
		comm = strings.TrimSpace(string(b))
	}
	return libs, comm, true
}

// Explain answers for target: a PID, or a pod as "namespace/name" or
// "name" (every process of that pod the agent has data for).
func Explain(doc *status.Doc, target string, local Local) ([]Process, error) {
	if pid, err := strconv.Atoi(target); err == nil {
		if pid <= 0 {
			return nil, fmt.Errorf("PID %d: want a positive number", pid)
		}
		return []Process{explainPID(doc, pid, local)}, nil
	}
	ns, name, hasNS := strings.Cut(target, "/")
	if !hasNS {
		ns, name = "", target
	}
	var out []Process
	for _, p := range doc.Processes {
		if p.Pod == name && (ns == "" || p.Namespace == ns) {
			out = append(out, explainPID(doc, p.PID, local))
		}
	}
	if len(out) == 0 {
		why := fmt.Sprintf("the agent has no process of pod %q", target)
		if doc.Kubernetes == nil {
			why += ": pod enrichment is off (the agent runs without --node-name / NODE_NAME); ask by PID instead"
		} else {
			why += ": either it made no CUDA/NCCL call since the agent started, or it is not on this node; ask by PID for the details"
		}
		return nil, errors.New(why)
	}
	return out, nil
}

func explainPID(doc *status.Doc, pid int, local Local) Process {
	p := Process{PID: pid, Libraries: []Library{}}
	p.Tracked = slices.Contains(doc.TrackedPIDs, pid)
	p.PerGPU = []status.ProcessStatus{}
	for _, ps := range doc.Processes {
		if ps.PID == pid {
			p.PerGPU, p.Comm = append(p.PerGPU, ps), ps.Comm
		}
	}
	byPath := map[string]*Library{}
	add := func(l Library) {
		if old, ok := byPath[l.Path]; ok && old.Attached {
			return // an attached alias of the same path wins over a failure
		}
		byPath[l.Path] = &l
	}
	for _, l := range doc.AttachedLibraries {
		if !slices.Contains(l.PIDs, pid) {
			continue
		}
		lib := Library{Library: l.Library, Path: l.Path, File: l.File, Attached: true, Missing: l.Missing, UprobeMulti: l.UprobeMulti, Paused: l.Paused, AgentSeen: true}
		for _, pr := range l.Probes {
			// One entry per function; timed functions also have a return probe.
			s := fmt.Sprintf("%s+%d", pr.Symbol, pr.Offset)
			if pr.Return {
				s += " (+return)"
			}
			if pr.Placement == status.PlacementPastRefused {
				s += " (past a first instruction the kernel refuses)"
			}
			lib.Probes = append(lib.Probes, s)
		}
		sort.Strings(lib.Probes)
		lib.Refused = refusedLines(l.Refused)
		add(lib)
		p.Pods = append(p.Pods, l.Pods...)
	}
	for _, f := range doc.AttachFailures {
		if !slices.Contains(f.PIDs, pid) {
			continue
		}
		add(Library{Library: f.Library, Path: f.Path, File: f.File, Reason: f.Reason, Error: f.Error, Attempts: f.Attempts, NextRetry: f.NextRetry,
			Refused: refusedLines(f.Refused), AgentSeen: true})
	}
	libs, comm, here := local.mapped(pid)
	if p.Comm == "" {
		p.Comm = comm
	}
	for _, q := range doc.Quarantined {
		if q.Library == "all" {
			continue // a node-wide stop: verdict says it
		}
		if _, mapped := libs[q.Path]; !mapped && !slices.Contains(q.PIDs, pid) {
			continue
		}
		where := "node-wide"
		if q.Scope == "tenant" {
			where = "in the processes of one tenant (cgroup)"
		}
		why := fmt.Sprintf("probes off %s since %s: process %d (%s) died of %s in the probes (%s) in this file (crash circuit breaker)",
			where, q.Time.Format(time.RFC3339), q.PID, q.Comm, q.Signal, strings.Join(q.Evidence, ", "))
		if q.LiftsAt != nil {
			why += "; lifts at " + q.LiftsAt.Format(time.RFC3339)
		}
		byPath[q.Path] = &Library{Library: q.Library, Path: q.Path, File: q.File, Reason: ReasonQuarantined, Error: why, AgentSeen: true}
	}
	for path, lib := range libs {
		if l, ok := byPath[path]; ok {
			l.LocalMapped = true
			continue
		}
		byPath[path] = &Library{Library: string(lib), Path: path, LocalMapped: true}
	}
	for _, l := range byPath {
		p.Libraries = append(p.Libraries, *l)
	}
	sort.Slice(p.Libraries, func(i, j int) bool { return p.Libraries[i].Path < p.Libraries[j].Path })
	p.Verdict, p.Why = verdict(doc, &p, here)
	for _, ps := range p.PerGPU {
		if ps.Launching != nil {
			p.Launch, p.LaunchWhy = LaunchVerdict(ps.Launching)
		}
	}
	return p
}

// refusedLines describes refused probes, one line each.
func refusedLines(rs []status.RefusedProbe) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s+%d (%s, file offset %#x)", r.Symbol, r.Offset, r.Reason, r.FileOffset))
	}
	return out
}

func verdict(doc *status.Doc, p *Process, here bool) (string, string) {
	var attached, failed, unseen, refused int
	for _, q := range doc.Quarantined {
		if q.Library == "all" {
			return VerdictQuarantined, fmt.Sprintf("every probe on this node is off since %s (%s: %s); no call of any process is counted until the agent restarts",
				q.Time.Format(time.RFC3339), q.Reason, q.KernelLog)
		}
	}
	for _, l := range p.Libraries {
		if l.Reason == ReasonQuarantined {
			return VerdictQuarantined, fmt.Sprintf("profi took the probes of %s off after a probed process crashed (%s); calls into it are not counted on this node", l.Path, l.Error)
		}
	}
	for _, l := range doc.AttachedLibraries {
		for _, u := range l.Unprobed {
			if u.PID == p.PID {
				return VerdictUnprobed, fmt.Sprintf("it has a tracer (pid %d: gdb, strace, CRIU?) and the agent leaves traced processes unprobed (--probe-traced-processes): no breakpoint in its memory, its calls are not counted until the tracer leaves",
					u.TracerPID)
			}
		}
	}
	for _, l := range p.Libraries {
		switch {
		case l.Attached:
			attached++
			refused += len(l.Refused)
		case l.AgentSeen:
			failed++
		default:
			unseen++
		}
	}
	switch {
	case attached > 0 && failed == 0 && unseen == 0 && refused > 0:
		return VerdictPartial, "its libraries are attached, but the kernel refuses a uprobe on some probed functions (see refused): calls of those are not counted, every other call is"
	case attached > 0 && failed == 0 && unseen == 0:
		return VerdictAttached, "every CUDA/NCCL library it maps has probes; its calls are counted"
	case attached > 0:
		return VerdictPartial, "some libraries it maps are not attached (see their reasons); calls into those are not counted"
	case failed > 0:
		return VerdictNotAttached, "the agent found its libraries but could not attach them (see the reasons); it retries with backoff"
	case doc.PIDFilter != 0 && doc.PIDFilter != p.PID && unseen > 0:
		return VerdictFiltered, fmt.Sprintf("it maps CUDA/NCCL libraries, but the agent runs with --pid %d and looks at no other process; restart the agent without --pid (or with --pid %d)", doc.PIDFilter, p.PID)
	case unseen > 0:
		return VerdictNotAttached, fmt.Sprintf("it maps CUDA/NCCL libraries the agent has not seen yet (last discovery %s); wait one --refresh-interval, or check the agent's --proc-path and hostPID", doc.LastDiscovery.Format(time.RFC3339))
	case here:
		return VerdictNotCUDA, "it maps no CUDA runtime, driver or NCCL library (libcudart.so, libcuda.so, libnccl.so): there is nothing to profile; a statically linked CUDA runtime is not supported"
	default:
		return VerdictUnknown, "the agent has no data for this PID and it does not run on this machine (explain looks at --proc-path for the local view: run it on the process's node, e.g. with kubectl exec into the agent pod)"
	}
}

// Write prints the answers for people.
func Write(w io.Writer, procs []Process, doc *status.Doc) {
	for i, p := range procs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "PID %d (%s): %s\n", p.PID, orDash(p.Comm), strings.ToUpper(strings.ReplaceAll(p.Verdict, "_", " ")))
		fmt.Fprintf(w, "  why: %s\n", p.Why)
		if len(p.PerGPU) > 0 {
			s := p.PerGPU[0]
			pod := "-"
			if s.Pod != "" {
				pod = s.Namespace + "/" + s.Pod + " container " + orDash(s.Container)
			}
			fmt.Fprintf(w, "  pod: %s (source: %s)\n", pod, s.PodSource)
			writeLayers(w, s.Layers)
		}
		if p.LaunchWhy != "" {
			fmt.Fprintf(w, "  launching: %s\n", p.LaunchWhy)
		}
		for _, s := range p.PerGPU {
			for _, b := range s.GPUBusy {
				fmt.Fprintf(w, "  gpu time on %s (driver samples since the agent started): sm %.1fs, memory %.1fs, encoder %.1fs, decoder %.1fs\n", b.UUID, b.SM, b.Memory, b.Encoder, b.Decoder)
			}
		}
		for _, s := range p.PerGPU {
			for _, r := range s.NCCLRanks {
				where := "outside NCCL"
				if r.Entered > r.Returned {
					where = "inside an NCCL call"
				}
				fmt.Fprintf(w, "  nccl: rank %d of %d of communicator %s, %d collectives entered, %d returned (%s)\n", r.Rank, r.NRanks, r.Communicator, r.Entered, r.Returned, where)
			}
		}
		if len(p.Libraries) == 0 {
			fmt.Fprintln(w, "  libraries: none")
		} else {
			fmt.Fprintln(w, "  libraries (paths inside the process's container):")
		}
		for _, l := range p.Libraries {
			switch {
			case l.Attached:
				kind := "classic uprobes"
				if l.UprobeMulti {
					kind = "uprobe_multi"
				}
				extra := ""
				if l.Paused {
					extra = ", paused by the overhead budget"
				}
				fmt.Fprintf(w, "    %s %s [%s]: attached, %d functions probed (%s%s)\n", l.Library, l.Path, l.File, len(l.Probes), kind, extra)
				fmt.Fprintf(w, "      probes: %s\n", strings.Join(l.Probes, ", "))
				if len(l.Missing) > 0 {
					fmt.Fprintf(w, "      missing symbols: %s\n", strings.Join(l.Missing, ", "))
				}
				if len(l.Refused) > 0 {
					fmt.Fprintf(w, "      refused by the kernel, not counted: %s\n", strings.Join(l.Refused, ", "))
				}
			case l.AgentSeen:
				fmt.Fprintf(w, "    %s %s [%s]: NOT attached: %s (%d attempts, next retry %s)\n", l.Library, l.Path, l.File, l.Reason, l.Attempts, l.NextRetry.Format(time.RFC3339))
				fmt.Fprintf(w, "      last error: %s\n", l.Error)
				if len(l.Refused) > 0 {
					fmt.Fprintf(w, "      refused by the kernel: %s\n", strings.Join(l.Refused, ", "))
				}
			default:
				fmt.Fprintf(w, "    %s %s: mapped, not seen by the agent\n", l.Library, l.Path)
			}
		}
		for _, s := range p.PerGPU {
			gpuSrc := s.GPUSource
			if gpuSrc == "" {
				gpuSrc = "not attributed"
			}
			fmt.Fprintf(w, "  gpu %s %s (source: %s)\n", orDash(s.GPU), s.GPUUUID, gpuSrc)
			fmt.Fprintf(w, "    counters: launches %d, active device memory %d B, memset %d B\n", s.Launches, s.ActiveMemoryBytes, s.MemsetBytes)
			if s.HeldIdleSeconds != nil {
				fmt.Fprintf(w, "    held idle: holds %d B of device memory here and has launched no kernel here for %.0fs\n", s.ActiveMemoryBytes, *s.HeldIdleSeconds)
			}
			writeGraphs(w, s)
			writeMap(w, "calls", s.Calls)
			writeMap(w, "errors", s.Errors)
			writeMap(w, "memcpy bytes", s.MemcpyBytes)
			writeMap(w, "nccl calls", s.NCCLCalls)
			writeMap(w, "nccl bytes", s.NCCLBytes)
			if len(s.NCCLOldestInflightSeconds) > 0 {
				keys := slices.Sorted(mapsKeys(s.NCCLOldestInflightSeconds))
				parts := make([]string, 0, len(keys))
				for _, k := range keys {
					parts = append(parts, fmt.Sprintf("%s %.1fs", k, s.NCCLOldestInflightSeconds[k]))
				}
				fmt.Fprintf(w, "    oldest in-flight nccl: %s\n", strings.Join(parts, ", "))
			}
		}
		if len(p.PerGPU) == 0 && (p.Verdict == VerdictAttached || p.Verdict == VerdictPartial) {
			fmt.Fprintln(w, "  counters: none yet (no call since it was attached)")
		}
	}
	if doc != nil {
		fmt.Fprintf(w, "\nagent %s, kernel mode %s, probe profile %s, up %.0fs, last discovery %s\n",
			doc.Version, doc.KernelMode, doc.ProbeProfile, doc.UptimeSeconds, doc.LastDiscovery.Format(time.RFC3339))
	}
}

// writeGraphs says what an entry ran through CUDA graphs: kernels that ran
// split into direct launches and graph kernels, launch calls captured, and
// on the process's first entry its graphs. Nothing for a process that
// used no graph.
func writeGraphs(w io.Writer, s status.ProcessStatus) {
	if s.GraphKernelLaunches > 0 || s.CapturedLaunches > 0 {
		line := fmt.Sprintf("    kernels that ran: %d (%d direct launches, %d through graph replays)", s.Launches+s.GraphKernelLaunches, s.Launches, s.GraphKernelLaunches)
		if s.CapturedLaunches > 0 {
			line += fmt.Sprintf("; %d launch calls captured into graphs (they ran nothing then)", s.CapturedLaunches)
		}
		fmt.Fprintln(w, line)
	}
	g := s.Graphs
	if g == nil {
		return
	}
	line := fmt.Sprintf("    graphs: %d built (%d executable alive), %d replays", g.Graphs, g.Execs, g.Replays)
	if g.UnknownReplays > 0 {
		line += fmt.Sprintf(" (%d of them ran graphs built before profi attached or past its caps: their kernels are not counted)", g.UnknownReplays)
	}
	if g.RefusedReplays > 0 {
		line += fmt.Sprintf(" (%d of them ran graphs profi refused to expand: a cycle, or nesting, size or work past its bounds; see /status refusals)", g.RefusedReplays)
	}
	if g.GraphKernelShare != nil {
		line += fmt.Sprintf(", %s of the process's counted kernels ran through graphs", percent(*g.GraphKernelShare))
	}
	fmt.Fprintln(w, line)
}

// percent prints a share in whole percent, never rounding a little to 0 %
// or almost all to 100 %.
func percent(share float64) string {
	switch {
	case share > 0 && share < 0.01:
		return "<1%"
	case share < 1 && share > 0.99:
		return ">99%"
	}
	return fmt.Sprintf("%.0f%%", share*100)
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func writeMap(w io.Writer, name string, m map[string]uint64) {
	if len(m) == 0 {
		return
	}
	keys := slices.Sorted(mapsKeys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	fmt.Fprintf(w, "    %s: %s\n", name, strings.Join(parts, ", "))
}

// writeLayers says which layers of the process profi probes, so the
// numbers above can be read for what they cover.
func writeLayers(w io.Writer, layers []status.Layer) {
	if len(layers) == 0 {
		return
	}
	parts := make([]string, 0, len(layers))
	for _, l := range layers {
		parts = append(parts, l.Layer+" "+l.State)
	}
	fmt.Fprintf(w, "  coverage: %s\n", strings.Join(parts, ", "))
	for _, l := range layers {
		if l.Detail != "" {
			fmt.Fprintf(w, "    %s (%s): %s\n", l.Layer, orDash(l.Path), l.Detail)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cli is the grammar of `profi explain`.
type cli struct {
	client.Flags
	ProcPath string `name:"proc-path" default:"/proc" placeholder:"PATH" help:"This machine's procfs, for the local view of the process; empty to skip it."`
	Output   string `name:"output" short:"o" default:"text" enum:"text,json" help:"text or json."`
	Target   string `arg:"" name:"PID|POD" help:"A host PID, or a pod as namespace/name or name."`
}

// Main runs `profi explain` with args (after the subcommand) and returns
// the exit status: 0 when every process is attached, 1 otherwise, 2 on
// usage or connection errors.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	k, err := kong.New(&c, kong.Name("profi explain"),
		kong.Description("Explain why a process (or each process of a pod) is or is not profiled, from the running agent's /status."),
		kong.Writers(stdout, stderr), kong.Exit(func(int) {}))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	_, err = k.Parse(args)
	if isHelp(args) { // kong printed the usage; a missing PID is no error then
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "profi explain: %v\n", err)
		return 2
	}
	cl, err := client.New(c.Flags)
	if err != nil {
		fmt.Fprintf(stderr, "profi explain: %v\n", err)
		return 2
	}
	var doc status.Doc
	if err := cl.Status(ctx, &doc); err != nil {
		fmt.Fprintf(stderr, "profi explain: %v\n", err)
		return 2
	}
	procs, err := Explain(&doc, c.Target, Local{Root: c.ProcPath})
	if err != nil {
		fmt.Fprintf(stderr, "profi explain: %v\n", err)
		return 1
	}
	if c.Output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(procs)
	} else {
		Write(stdout, procs, &doc)
	}
	for _, p := range procs {
		if p.Verdict != VerdictAttached {
			return 1
		}
	}
	return 0
}

func isHelp(args []string) bool {
	return slices.Contains(args, "--help") || slices.Contains(args, "-h")
}
