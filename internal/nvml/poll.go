package nvml

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"
)

// maxEvents bounds the XID events drained per poll, maxXIDs the distinct
// XIDs counted per GPU (NVIDIA documents fewer than 200).
const (
	maxEvents = 1024
	maxXIDs   = 256
)

// worker does the NVML calls. Its state is touched only by the step
// goroutine, and the Poller starts a step only after the previous one has
// returned, so no lock is needed.
type worker struct {
	// onXid: Options.OnXid.
	onXid func(index int, uuid string, xid uint64)
	lib   Library
	log   *slog.Logger

	initialised  bool
	path, driver string
	devs         []device
	events       EventSet            // nil: XID events unsupported
	xids         []map[uint64]uint64 // by position in devs
	migOwner     map[string]int      // MIG UUID → position in devs, as of the last poll
	warned       map[string]string   // "gpu/field" → last error logged
	gone         error               // ErrDriverGone met during this poll
	lastErr      string              // last failed query of this poll
	xidOverflow  bool

	// Per-process utilization and GPM, by device UUID (GPU or MIG).
	gpmMode     string // GPMAuto, GPMOn, GPMOff
	gpmInterval time.Duration
	gpmDue      time.Time
	lastSeen    map[string]uint64 // newest process sample timestamp seen
	// busy integrates the process samples (busyOf); it outlives an NVML
	// restart, so its counters never go back.
	busy      *busyCounter
	gpmPrev   map[string]GPMSample // the sample the next interval starts from
	gpmValues map[string]map[GPMMetric]float64
	gpmState  map[string]string
	gpmWarned map[string]bool
}

// GPM modes (--gpm).
const (
	GPMAuto = "auto" // where the GPU supports it; silent otherwise
	GPMOn   = "on"   // like auto, but a GPU without GPM is logged as a warning
	GPMOff  = "off"
)

// device is an inventoried GPU.
type device struct {
	index      int
	uuid, name string
	h          Device
}

func newWorker(lib Library, log *slog.Logger, gpmMode string, gpmInterval time.Duration) *worker {
	return &worker{
		lib: lib, log: log, warned: map[string]string{},
		gpmMode: gpmMode, gpmInterval: gpmInterval,
		lastSeen: map[string]uint64{}, gpmPrev: map[string]GPMSample{}, busy: newBusyCounter(),
		gpmValues: map[string]map[GPMMetric]float64{}, gpmState: map[string]string{}, gpmWarned: map[string]bool{},
	}
}

// step runs one step; it is the body of a step goroutine.
func (w *worker) step(k stepKind) stepResult {
	r := stepResult{kind: k, started: time.Now()}
	switch k {
	case stepInit:
		r.err = w.init()
	case stepPoll:
		r.snap = w.poll(r.started)
	case stepShutdown:
		w.shutdown()
	}
	return r
}

// init initialises NVML and takes the device inventory.
func (w *worker) init() error {
	if err := w.lib.Init(); err != nil {
		return fmt.Errorf("nvml init: %w", err)
	}
	if p, ok := w.lib.(pathed); ok {
		w.path = p.Path()
	}
	n, err := w.lib.DeviceCount()
	if err != nil {
		_ = w.lib.Shutdown()
		return fmt.Errorf("nvml device count: %w", err)
	}
	if v, err := w.lib.DriverVersion(); err == nil {
		w.driver = v
	}
	w.devs = w.devs[:0]
	for i := range n {
		h, err := w.lib.Device(i)
		if err != nil {
			w.log.Warn("GPU skipped: no NVML handle", "gpu", i, "err", err)
			continue
		}
		uuid, err := h.UUID()
		if err != nil {
			w.log.Warn("GPU skipped: no UUID", "gpu", i, "err", err)
			continue
		}
		name, err := h.Name()
		if err != nil && !errors.Is(err, ErrNotSupported) {
			w.log.Warn("GPU name unavailable", "gpu", i, "err", err)
		}
		w.devs = append(w.devs, device{index: i, uuid: uuid, name: name, h: h})
	}
	w.initEvents()
	w.initialised = true
	return nil
}

// initEvents registers every GPU's XID events in one event set.
func (w *worker) initEvents() {
	w.events, w.xids = nil, nil
	set, err := w.lib.NewEventSet()
	if err != nil {
		if !errors.Is(err, ErrNotSupported) {
			w.log.Warn("XID events unavailable", "err", err)
		}
		return
	}
	xids := make([]map[uint64]uint64, len(w.devs))
	registered := 0
	for i, d := range w.devs {
		if err := set.Register(d.h); err != nil {
			if !errors.Is(err, ErrNotSupported) {
				w.log.Warn("XID events unavailable on a GPU", "gpu", d.index, "err", err)
			}
			continue
		}
		xids[i] = map[uint64]uint64{}
		registered++
	}
	if registered == 0 {
		_ = set.Free()
		return
	}
	w.events, w.xids = set, xids
}

func (w *worker) shutdown() {
	for uuid, smp := range w.gpmPrev {
		_ = smp.Free()
		delete(w.gpmPrev, uuid)
	}
	clear(w.gpmValues)
	clear(w.gpmState)
	clear(w.lastSeen)
	w.busy.restart()
	if w.events != nil {
		_ = w.events.Free()
		w.events = nil
	}
	if err := w.lib.Shutdown(); err != nil && !errors.Is(err, ErrDriverGone) {
		w.log.Warn("nvmlShutdown failed", "err", err)
	}
	w.initialised = false
}

// poll reads every GPU. If the driver went away meanwhile, the snapshot
// is Up=false and the worker shuts NVML down, to initialise it again.
func (w *worker) poll(started time.Time) *Snapshot {
	w.gone, w.lastErr = nil, ""
	w.drainEvents()
	s := &Snapshot{Up: true, Time: started, Library: w.path, DriverVersion: w.driver, GPUs: make([]GPU, 0, len(w.devs))}
	w.migOwner = map[string]int{}
	gpmNow := w.gpmMode != GPMOff && !started.Before(w.gpmDue)
	if gpmNow {
		w.gpmDue = started.Add(w.gpmInterval)
	}
	for i, d := range w.devs {
		g := w.pollGPU(d)
		if w.xids != nil && w.xids[i] != nil {
			g.XIDErrors = maps.Clone(w.xids[i])
		}
		for _, m := range g.MIGDevices {
			w.migOwner[m.UUID] = i
		}
		w.pollInstances(&g, d, gpmNow)
		s.GPUs = append(s.GPUs, g)
	}
	s.PollDuration = time.Since(started)
	s.LastError = w.lastErr
	if w.gone != nil {
		w.shutdown()
		return &Snapshot{Reason: fmt.Sprintf("nvml poll: %v", w.gone), Time: started, PollDuration: s.PollDuration}
	}
	return s
}

// ok reports whether a field's query succeeded. NotSupported is silent;
// any other error is logged once per GPU, field and message.
func (w *worker) ok(gpu int, field string, err error) bool {
	key := fmt.Sprintf("%d/%s", gpu, field)
	if err == nil {
		delete(w.warned, key)
		return true
	}
	if errors.Is(err, ErrNotSupported) {
		return false
	}
	if errors.Is(err, ErrDriverGone) {
		if w.gone == nil {
			w.gone = err
		}
		return false
	}
	w.lastErr = fmt.Sprintf("gpu %d %s: %v", gpu, field, err)
	if w.warned[key] != err.Error() {
		w.warned[key] = err.Error()
		w.log.Warn("NVML query failed; field skipped", "gpu", gpu, "field", field, "err", err)
	}
	return false
}

func (w *worker) pollGPU(d device) GPU {
	g := GPU{Index: d.index, UUID: d.uuid, Name: d.name}
	h, i := d.h, d.index

	if v, err := h.MinorNumber(); w.ok(i, "minor_number", err) {
		g.Minor = new(v)
	}
	var migInstances map[uint32]string
	if on, err := h.MigMode(); w.ok(i, "mig_mode", err) {
		g.MIGEnabled = new(on)
		if on {
			if migs, err := h.MigDevices(); w.ok(i, "mig_devices", err) {
				g.MIGDevices = migs
				migInstances = make(map[uint32]string, len(migs))
				for _, m := range migs {
					migInstances[m.GPUInstanceID] = m.UUID
				}
			}
		}
	}
	if v, err := h.Temperature(); w.ok(i, "temperature", err) {
		g.TemperatureCelsius = new(float64(v))
	}
	if v, err := h.PowerUsage(); w.ok(i, "power", err) {
		g.PowerWatts = new(float64(v) / 1000) // mW
	}
	if v, err := h.ClockInfo(ClockSM); w.ok(i, "clock_sm", err) {
		g.SMClockMHz = new(float64(v))
	}
	if v, err := h.ClockInfo(ClockMem); w.ok(i, "clock_mem", err) {
		g.MemClockMHz = new(float64(v))
	}
	if gpu, mem, err := h.Utilization(); w.ok(i, "utilization", err) {
		g.GPUUtilization = new(float64(gpu) / 100)
		g.MemoryUtilization = new(float64(mem) / 100)
	}
	if m, err := h.Memory(); w.ok(i, "memory", err) {
		g.Memory = &m
	}
	if v, err := h.ECCErrors(ECCCorrected); w.ok(i, "ecc_corrected", err) {
		g.ECCCorrected = new(v)
	}
	if v, err := h.ECCErrors(ECCUncorrected); w.ok(i, "ecc_uncorrected", err) {
		g.ECCUncorrected = new(v)
	}
	if bits, err := h.ClockEventReasons(); w.ok(i, "clock_event_reasons", err) {
		g.Throttle = new(ThrottleFromReasons(bits))
	}
	if procs, err := h.ComputeProcesses(); w.ok(i, "processes", err) {
		g.Processes = processes(procs, migInstances)
	}
	if v, err := h.PCIeThroughput(PCIeTX); w.ok(i, "pcie_tx", err) {
		g.PCIeTXBytesPerSecond = new(float64(v) * 1024) // KB/s
	}
	if v, err := h.PCIeThroughput(PCIeRX); w.ok(i, "pcie_rx", err) {
		g.PCIeRXBytesPerSecond = new(float64(v) * 1024)
	}
	g.NVLinkErrors = w.nvlink(i, h)
	if v, err := h.PCIBusID(); w.ok(i, "pci_bus_id", err) {
		g.PCIBusID = v
	}
	return g
}

// pollInstances reads per-process utilization and (when due) GPM of the
// GPU and of each of its MIG devices.
func (w *worker) pollInstances(g *GPU, d device, gpmNow bool) {
	type inst struct {
		uuid string
		h    Device // for process utilization; nil: none
		gi   uint32 // for GPM through the parent's handle
	}
	insts := []inst{{uuid: d.uuid, h: d.h, gi: NoInstance}}
	for _, m := range g.MIGDevices {
		insts = append(insts, inst{uuid: m.UUID, h: m.h, gi: m.GPUInstanceID})
	}
	for _, in := range insts {
		st := Instance{UUID: in.uuid, ProcessUtilization: StateNotSupported, GPM: StateOff}
		if in.h != nil {
			st.ProcessUtilization = w.processUtilization(g, d.index, in.uuid, in.h)
		}
		if w.gpmMode != GPMOff {
			if gpmNow {
				w.gpmState[in.uuid] = w.gpm(d, in.uuid, in.gi)
			}
			st.GPM = w.gpmState[in.uuid]
			if vals, ok := w.gpmValues[in.uuid]; ok && st.GPM == StateOK {
				g.GPM = append(g.GPM, GPMValues{UUID: in.uuid, Values: vals})
			}
		}
		g.Instances = append(g.Instances, st)
	}
	for _, in := range insts {
		g.ProcessBusy = append(g.ProcessBusy, w.busy.of(in.uuid, busyKeep)...)
	}
	slices.SortFunc(g.ProcessUtilization, func(a, b ProcessUtilization) int {
		return cmp.Or(cmp.Compare(a.UUID, b.UUID), cmp.Compare(a.PID, b.PID))
	})
}

// busyKeep is how long a process's busy totals stay after its last
// sample: every scrape in between reads them (busyCounter.of).
const busyKeep = 10 * time.Minute

// processUtilization adds one device's process samples newer than the
// last seen to g and returns the source's state. Samples are averaged per
// PID: NVML returns one per sampling period of the driver (about 1/6 s),
// several per poll.
func (w *worker) processUtilization(g *GPU, gpu int, uuid string, h Device) string {
	samples, err := h.ProcessUtilization(w.lastSeen[uuid])
	switch {
	case errors.Is(err, ErrNotFound): // supported; no process ran since
		return StateOK
	case errors.Is(err, ErrNotSupported):
		return StateNotSupported
	case !w.ok(gpu, "process_utilization "+uuid, err):
		return "error: " + err.Error()
	}
	type sum struct {
		sm, mem, enc, dec uint64
		n                 int
	}
	by := map[uint32]*sum{}
	var pids []uint32
	for _, s := range samples {
		if s.TimeStamp <= w.lastSeen[uuid] {
			continue // an older sample a driver returned anyway
		}
		x := by[s.PID]
		if x == nil {
			x = &sum{}
			by[s.PID] = x
			pids = append(pids, s.PID)
		}
		x.sm += uint64(min(s.SM, 100))
		x.mem += uint64(min(s.Memory, 100))
		x.enc += uint64(min(s.Encoder, 100))
		x.dec += uint64(min(s.Decoder, 100))
		x.n++
	}
	w.busy.add(uuid, samples, w.lastSeen[uuid])
	for _, s := range samples {
		w.lastSeen[uuid] = max(w.lastSeen[uuid], s.TimeStamp)
	}
	for _, pid := range pids {
		x := by[pid]
		n := float64(x.n) * 100
		g.ProcessUtilization = append(g.ProcessUtilization, ProcessUtilization{
			UUID: uuid, PID: pid, SM: float64(x.sm) / n, Memory: float64(x.mem) / n,
			Encoder: float64(x.enc) / n, Decoder: float64(x.dec) / n, Samples: x.n,
		})
	}
	return StateOK
}

// gpm takes a new GPM sample of the device (or MIG instance gi), computes
// the metrics since the previous one and returns the state. A sample that
// fails drops the previous one: the next interval starts afresh, so values
// never span a period in which the counters were held by someone else.
func (w *worker) gpm(d device, uuid string, gi uint32) string {
	fail := func(state string) string {
		if prev := w.gpmPrev[uuid]; prev != nil {
			_ = prev.Free()
			delete(w.gpmPrev, uuid)
		}
		delete(w.gpmValues, uuid)
		if state != StateOK && w.gpmMode == GPMOn && !w.gpmWarned[uuid] {
			w.gpmWarned[uuid] = true
			w.log.Warn("--gpm=on but GPM metrics are unavailable on a device", "gpu", d.index, "uuid", uuid, "state", state)
		}
		return state
	}
	if gi == NoInstance {
		ok, err := d.h.GPMSupported()
		if errors.Is(err, ErrNotSupported) || (err == nil && !ok) {
			return fail(StateNotSupported)
		}
		if !w.ok(d.index, "gpm_support", err) {
			return fail("error: " + err.Error())
		}
	} else if st := w.gpmState[d.uuid]; st == StateNotSupported {
		return fail(StateNotSupported) // MIG GPM needs the parent's support
	}
	cur, err := d.h.GPMSample(gi)
	switch {
	case errors.Is(err, ErrInUse):
		return fail(StateHeld)
	case errors.Is(err, ErrNotSupported):
		return fail(StateNotSupported)
	case !w.ok(d.index, "gpm_sample "+uuid, err):
		return fail("error: " + err.Error())
	}
	prev := w.gpmPrev[uuid]
	w.gpmPrev[uuid] = cur
	if prev == nil {
		return StateWarmingUp
	}
	defer func() { _ = prev.Free() }()
	vals, err := w.lib.GPMMetrics(prev, cur, GPMMetrics)
	if !w.ok(d.index, "gpm_metrics "+uuid, err) {
		delete(w.gpmValues, uuid)
		if errors.Is(err, ErrNotSupported) {
			return StateNotSupported
		}
		return "error: " + err.Error()
	}
	w.gpmValues[uuid] = vals
	return StateOK
}

// processes merges NVML's entries by PID (a PID appears once per MIG
// instance it uses) and sorts them.
func processes(infos []ProcessInfo, migInstances map[uint32]string) []Process {
	at := map[uint32]int{} // PID → position in out
	var out []Process
	for _, in := range infos {
		j, ok := at[in.PID]
		if !ok {
			j = len(out)
			at[in.PID] = j
			out = append(out, Process{PID: in.PID})
		}
		p := &out[j]
		if in.UsedBytes != MemoryNotAvailable {
			p.UsedBytes += in.UsedBytes
			p.MemoryKnown = true
		}
		if uuid, ok := migInstances[in.GPUInstanceID]; ok && in.GPUInstanceID != NoInstance && !slices.Contains(p.MIGUUIDs, uuid) {
			p.MIGUUIDs = append(p.MIGUUIDs, uuid)
		}
	}
	slices.SortFunc(out, func(a, b Process) int { return cmp.Compare(a.PID, b.PID) })
	if out == nil {
		out = []Process{} // supported, none running
	}
	return out
}

// nvlink sums the data-link error counters over the active links. The walk
// ends at the first link whose state NVML does not support (no NVLink, or
// past the GPU's last link).
func (w *worker) nvlink(gpu int, h Device) map[NVLinkCounter]uint64 {
	var sums map[NVLinkCounter]uint64
	for link := range MaxNVLinks {
		active, err := h.NVLinkActive(link)
		if err != nil {
			break // not supported, or no such link
		}
		if !active {
			continue
		}
		for _, c := range NVLinkCounters {
			v, err := h.NVLinkErrors(link, c)
			if !w.ok(gpu, fmt.Sprintf("nvlink_%d_%d", link, c), err) {
				continue
			}
			if sums == nil {
				sums = map[NVLinkCounter]uint64{}
			}
			sums[c] += v
		}
	}
	return sums
}

// drainEvents counts the pending XID events.
func (w *worker) drainEvents() {
	if w.events == nil {
		return
	}
	for range maxEvents {
		ev, err := w.events.Poll()
		if errors.Is(err, ErrNoEvent) {
			return
		}
		if err != nil {
			w.ok(-1, "xid_events", err)
			return
		}
		i := w.deviceOf(ev.UUID)
		if i < 0 || w.xids[i] == nil {
			continue
		}
		if _, seen := w.xids[i][ev.XID]; !seen && len(w.xids[i]) >= maxXIDs {
			if !w.xidOverflow {
				w.xidOverflow = true
				w.log.Warn("too many distinct XIDs on a GPU; new ones are not counted", "gpu", w.devs[i].index, "xid", ev.XID, "limit", maxXIDs)
			}
			continue
		}
		w.xids[i][ev.XID]++
		if w.onXid != nil {
			w.onXid(w.devs[i].index, w.devs[i].uuid, ev.XID)
		}
	}
}

// deviceOf finds the device an event UUID names (a GPU, or one of its MIG
// devices as of the last poll); -1 if none.
func (w *worker) deviceOf(uuid string) int {
	for i, d := range w.devs {
		if d.uuid == uuid {
			return i
		}
	}
	if i, ok := w.migOwner[uuid]; ok {
		return i
	}
	return -1
}
