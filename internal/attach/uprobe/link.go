package uprobe

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/ops"
)

// Reasons a link fails (profi_system_attach_failures_total, docs/INTERFACE.md 5.7).
const (
	ReasonSymbolNotFound    = "symbol_not_found"
	ReasonProcessExited     = "process_exited"
	ReasonUnsupportedKernel = "unsupported_kernel"
	ReasonOther             = "other"
)

// Linker makes the links of probe sets: one uprobe (and uretprobe) per
// function, or one uprobe_multi link per program. It knows nothing of
// who asks: the caller keeps the links and the refusals.
type Linker struct {
	Programs map[string]*ebpf.Program // by program name
	// Multi: Programs were loaded for uprobe_multi links
	// (bpfobj.Objects.UprobeMulti), so the probes of one program are one
	// link per file, budget class and PID filter instead of one link per
	// symbol. False: classic uprobes, one per function.
	Multi bool
	Log   *slog.Logger

	mu sync.Mutex
	// trial is the empty uprobe_multi program findRefused tries addresses
	// with; loaded on first use.
	trial *ebpf.Program
	// closing are the partial links of failed Links being released in
	// the background (closeLater).
	closing sync.WaitGroup
}

// closeLater releases the links a failed Link made, in the background: a
// classic link takes about 83 ms to go (release.go), so a file failing
// after a hundred links held its caller for seconds; Close waits for them.
func (l *Linker) closeLater(links *Links) {
	if links.Len() > 0 {
		l.closing.Go(links.Close)
	}
}

// Refusals are the probe addresses (file offsets) of one file the kernel
// refused when tried: never offered again while the file stays mapped.
type Refusals map[uint64]Refusal

// Set is one file's probes to link.
type Set struct {
	Exe    *link.Executable
	Path   string          // for errors and logs
	Funcs  map[string]Func // the file's functions (DefinedFuncs)
	FileID uint32          // goes into every probe's cookie
	PID    int             // uprobe PID filter; 0 = every process
	// Refused are the file's known refusals; refusals found while
	// linking are added (it must not be nil).
	Refused Refusals
}

// Refusal says why the kernel refuses a probe at fn: from the file's
// bytes (DefinedFuncs), or found by trying (known); nil when it is not
// known to.
func (r Refusals) Refusal(fn Func) *Refusal {
	if fn.Refused != nil {
		return fn.Refused
	}
	if x, ok := r[fn.ProbeAddr()]; ok {
		return &x
	}
	return nil
}

// Links are the links of one probe set.
type Links struct {
	Entries, Returns []link.Link
	Multi            bool // some links are uprobe_multi links
}

// Len is the number of links.
func (s *Links) Len() int {
	if s == nil {
		return 0
	}
	return len(s.Entries) + len(s.Returns)
}

// Close detaches every entry probe before any return probe, so no return
// fires for a call whose entry was never recorded. Within each kind the
// links close in parallel: each detach waits for an RCU grace period,
// which one by one held the attacher for seconds. A nil set is none.
func (s *Links) Close() {
	if s == nil {
		return
	}
	closeAll(s.Entries)
	closeAll(s.Returns)
	s.Entries, s.Returns = nil, nil
}

func closeAll(links []link.Link) {
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Go(func() { _ = l.Close() }) // fails only if already closed
	}
	wg.Wait()
}

func (l *Linker) log() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return l.Log
}

// Link attaches every probe whose symbol the file defines, except those
// the kernel refuses a uprobe on: known ones are not offered; one found
// now (a classic attach refused, or a uprobe_multi link failing because
// of one refused address, found by findRefused) is added to s.Refused
// and left out, and the rest attached. All or nothing otherwise: on any
// other error the links made so far are closed, and the error comes with
// its reason (Reason*).
func (l *Linker) Link(s Set, probes []ops.Probe) (links *Links, reason string, err error) {
	offered := func() []ops.Probe {
		var out []ops.Probe
		for _, p := range probes {
			// A symbol the file lacks is listed as missing or absent by the caller.
			if fn, ok := s.Funcs[p.Symbol]; ok && s.Refused.Refusal(fn) == nil {
				out = append(out, p)
			}
		}
		return out
	}
	if l.Multi {
		links, err := l.linkMulti(s, offered())
		if err != nil && (isRefusal(err) || errors.Is(err, unix.EINVAL)) && l.findRefused(s, offered()) > 0 {
			links, err = l.linkMulti(s, offered())
		}
		if err != nil {
			return nil, classify(err), fmt.Errorf("attach uprobe_multi in %s: %w", s.Path, err)
		}
		return links, "", nil
	}
	links = &Links{}
	for _, p := range offered() {
		fn := s.Funcs[p.Symbol]
		// Address: cilium/ebpf takes the file offset read by elfsym
		// instead of parsing the file's symbol tables again.
		opts := &link.UprobeOptions{PID: s.PID, Cookie: ops.Cookie(p.Op, s.FileID), Address: fn.Addr, Offset: fn.Offset}
		// Return probe first: an entry without its return would leave
		// in-flight state behind; a return without entry is tolerated
		// and counted in BPF.
		var ret link.Link
		if p.Return != "" {
			r, err := s.Exe.Uretprobe(p.Symbol, l.Programs[p.Return], opts)
			if err != nil && isRefusal(err) {
				l.refuse(s, fn.ProbeAddr(), fmt.Errorf("%s: %w", p.Symbol, err))
				continue
			}
			if err != nil {
				l.closeLater(links)
				return nil, classify(err), fmt.Errorf("attach return probe %s in %s: %w", p.Symbol, s.Path, err)
			}
			ret = r
		}
		e, err := s.Exe.Uprobe(p.Symbol, l.Programs[p.Entry], opts)
		if err != nil {
			if ret != nil {
				l.closeLater(&Links{Returns: []link.Link{ret}})
			}
			if isRefusal(err) {
				l.refuse(s, fn.ProbeAddr(), fmt.Errorf("%s: %w", p.Symbol, err))
				continue
			}
			l.closeLater(links)
			return nil, classify(err), fmt.Errorf("attach probe %s in %s: %w", p.Symbol, s.Path, err)
		}
		if ret != nil {
			links.Returns = append(links.Returns, ret)
		}
		links.Entries = append(links.Entries, e)
	}
	return links, "", nil
}

// linkMulti attaches probes with one uprobe_multi link per program:
// every return program first, like the classic path, then the entry
// programs. Each function keeps the offset the classic probe would have
// and the same cookie (operation and file). All or nothing: on error the
// links made so far are closed.
func (l *Linker) linkMulti(s Set, probes []ops.Probe) (*Links, error) {
	type group struct {
		prog                    string
		symbols                 []string
		addrs, offsets, cookies []uint64
	}
	var returns, entries []*group
	add := func(groups *[]*group, prog string, p ops.Probe) {
		i := slices.IndexFunc(*groups, func(g *group) bool { return g.prog == prog })
		if i < 0 {
			*groups = append(*groups, &group{prog: prog})
			i = len(*groups) - 1
		}
		g := (*groups)[i]
		g.symbols = append(g.symbols, p.Symbol)
		g.addrs = append(g.addrs, s.Funcs[p.Symbol].Addr)
		g.offsets = append(g.offsets, s.Funcs[p.Symbol].Offset)
		g.cookies = append(g.cookies, ops.Cookie(p.Op, s.FileID))
	}
	for _, p := range probes {
		if _, ok := s.Funcs[p.Symbol]; !ok {
			continue // listed as missing or absent by the caller
		}
		add(&entries, p.Entry, p)
		if p.Return != "" {
			add(&returns, p.Return, p)
		}
	}
	links := &Links{Multi: true}
	for _, g := range returns {
		opts := &link.UprobeMultiOptions{Addresses: g.addrs, Offsets: g.offsets, Cookies: g.cookies, PID: uint32(s.PID)}
		r, err := s.Exe.UretprobeMulti(g.symbols, l.Programs[g.prog], opts)
		if err != nil {
			l.closeLater(links)
			return nil, fmt.Errorf("return probes %v: %w", g.symbols, err)
		}
		links.Returns = append(links.Returns, r)
	}
	for _, g := range entries {
		opts := &link.UprobeMultiOptions{Addresses: g.addrs, Offsets: g.offsets, Cookies: g.cookies, PID: uint32(s.PID)}
		e, err := s.Exe.UprobeMulti(g.symbols, l.Programs[g.prog], opts)
		if err != nil {
			l.closeLater(links)
			return nil, fmt.Errorf("entry probes %v: %w", g.symbols, err)
		}
		links.Entries = append(links.Entries, e)
	}
	return links, nil
}

// refuse remembers that the kernel refused a probe at file offset addr
// of s's file.
func (l *Linker) refuse(s Set, addr uint64, err error) {
	s.Refused[addr] = Refusal{Reason: RefusedByKernel, Err: err.Error()}
	l.log().Warn("the kernel refuses a uprobe at this address; the function is left out", "path", s.Path, "address", fmt.Sprintf("%#x", addr), "err", err)
}

// isRefusal reports whether err is the kernel refusing a uprobe on the
// instruction at its address: ENOTSUPP (524; cilium/ebpf prints it as
// "operation not supported") or EOPNOTSUPP.
func isRefusal(err error) bool {
	return errors.Is(err, unix.Errno(524)) || errors.Is(err, unix.EOPNOTSUPP)
}

// findRefused tries each probe address of probes alone, with an empty
// program and the same PID filter, after a uprobe_multi link of them
// failed in a way a refused address explains (one refused address fails
// the whole link). The addresses the kernel refuses are added to
// s.Refused. It returns how many it found; 0 when it could not tell (the
// caller then reports the link's own error).
func (l *Linker) findRefused(s Set, probes []ops.Probe) int {
	prog, err := l.trialProgram()
	if err != nil {
		l.log().Warn("cannot look for refused probe addresses", "path", s.Path, "err", err)
		return 0
	}
	var trials []link.Link
	defer func() { closeAll(trials) }()
	found := 0
	tried := map[uint64]bool{}
	for _, p := range probes {
		fn, ok := s.Funcs[p.Symbol]
		if !ok || tried[fn.ProbeAddr()] {
			continue
		}
		tried[fn.ProbeAddr()] = true
		t, err := s.Exe.UprobeMulti(nil, prog, &link.UprobeMultiOptions{
			Addresses: []uint64{fn.Addr}, Offsets: []uint64{fn.Offset}, PID: uint32(s.PID),
		})
		switch {
		case err == nil:
			trials = append(trials, t)
		case isRefusal(err):
			l.refuse(s, fn.ProbeAddr(), fmt.Errorf("%s: %w", p.Symbol, err))
			found++
		default:
			l.log().Debug("probe address trial failed for another reason", "path", s.Path, "symbol", p.Symbol, "err", err)
			return found
		}
	}
	return found
}

// trialProgram returns the empty uprobe_multi program of findRefused.
func (l *Linker) trialProgram() (*ebpf.Program, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.trial != nil {
		return l.trial, nil
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "refusal_trial", // not "profi_…": that prefix is for metric names
		Type:         ebpf.Kprobe,
		AttachType:   ebpf.AttachTraceUprobeMulti,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "Dual BSD/GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("load the trial program: %w", err)
	}
	l.trial = prog
	return prog, nil
}

// Tried reports whether findRefused loaded its trial program (for tests).
func (l *Linker) Tried() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trial != nil
}

// Close waits for the partial links of failed Links to go and releases
// the trial program; the links made stay the caller's.
func (l *Linker) Close() {
	l.closing.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.trial != nil {
		l.trial.Close()
		l.trial = nil
	}
}

// classify is the attach-failure reason of a link error.
func classify(err error) string {
	switch {
	case errors.Is(err, syscall.ESRCH), errors.Is(err, os.ErrNotExist):
		return ReasonProcessExited
	case errors.Is(err, link.ErrNoSymbol):
		return ReasonSymbolNotFound
	case errors.Is(err, ebpf.ErrNotSupported):
		return ReasonUnsupportedKernel
	default:
		return ReasonOther
	}
}
