//go:build linux

package aggregate

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// MapSource reads the loaded BPF maps.
type MapSource struct {
	Objects *bpfobj.Objects
}

// Aggregated sums each key's per-CPU values.
func (s MapSource) Aggregated(fn func(bpfobj.ProfiAggKey, *bpfobj.ProfiAggVal)) error {
	return sumPerCPU(s.Objects.Aggregated, fn)
}

// Launches sums each key's per-CPU values.
func (s MapSource) Launches(fn func(bpfobj.ProfiLaunchKey, *bpfobj.ProfiLaunchVal)) error {
	return sumPerCPU(s.Objects.LaunchAgg, fn)
}

// NCCL sums each nccl_agg key's per-CPU values.
func (s MapSource) NCCL(fn func(bpfobj.ProfiNcclKey, *bpfobj.ProfiNcclVal)) error {
	return sumPerCPU(s.Objects.NcclAgg, fn)
}

// NCCLInflight reads the NCCL calls in progress, by pid_tgid.
func (s MapSource) NCCLInflight(fn func(tid uint64, c *bpfobj.ProfiNcclCall)) error {
	return each(s.Objects.NcclInflight, fn)
}

// CUDAInflight reads the timed CUDA calls in progress, by pid_tgid.
func (s MapSource) CUDAInflight(fn func(tid uint64, c *bpfobj.ProfiInflightCall)) error {
	return each(s.Objects.Inflight, fn)
}

// NCCLComms reads the communicators seen at init.
func (s MapSource) NCCLComms(fn func(bpfobj.ProfiNcclCommKey, *bpfobj.ProfiNcclComm)) error {
	return each(s.Objects.NcclComms, fn)
}

// GraphNodes reads what each CUDA graph runs (graph_nodes).
func (s MapSource) GraphNodes(fn func(bpfobj.ProfiGraphNodeKey, *bpfobj.ProfiGraphNodeVal)) error {
	return each(s.Objects.GraphNodes, fn)
}

// count is a per-CPU u64 counter value that sumPerCPU can add up.
type count uint64

func (c *count) Add(o *count) { *c += *o }

// GraphReplays sums each graph_replays key's per-CPU counts.
func (s MapSource) GraphReplays(fn func(bpfobj.ProfiReplayKey, uint64)) error {
	return sumPerCPU(s.Objects.GraphReplays, func(k bpfobj.ProfiReplayKey, n *count) { fn(k, uint64(*n)) })
}

// Unseen looks pid up in unseen_procs.
func (s MapSource) Unseen(pid uint32) (bpfobj.ProfiProcIdentity, bool) {
	var id bpfobj.ProfiProcIdentity
	err := s.Objects.UnseenProcs.Lookup(pid, &id)
	return id, err == nil
}

// Launchers takes the threads noted in launch_threads since the last
// call: each entry read is deleted (BPF notes a thread once).
func (s MapSource) Launchers(fn func(tid, pid uint32)) error {
	var tids []uint32
	err := each(s.Objects.LaunchThreads, func(tid uint32, pid *uint32) {
		fn(tid, *pid)
		tids = append(tids, tid)
	})
	for _, tid := range tids {
		if derr := s.Objects.LaunchThreads.Delete(tid); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
			err = errors.Join(err, fmt.Errorf("delete launch_threads %d: %w", tid, derr))
		}
	}
	return err
}

// Tenants reads each tenant's keys and refusals (tenant_quotas).
func (s MapSource) Tenants(fn func(uint64, *bpfobj.ProfiTenantQuota)) error {
	return each(s.Objects.TenantQuotas, fn)
}

// Quotas reads each process's quotas (pid_quotas).
func (s MapSource) Quotas(fn func(uint32, bpfobj.ProfiPidQuota)) error {
	return each(s.Objects.PidQuotas, func(pid uint32, q *bpfobj.ProfiPidQuota) { fn(pid, *q) })
}

// each hands fn every key and value of a map that is not per-CPU.
func each[K, V any](m *ebpf.Map, fn func(K, *V)) error {
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(k, &v)
	}
	return it.Err()
}

// batchKeys is how many keys one BPF_MAP_LOOKUP_BATCH reads: one
// syscall per 1,024 keys instead of two per key (NextKey + Lookup), which
// at 5·10⁴ series was most of a drain.
const batchKeys = 1024

// sumPerCPU walks a per-CPU hash and hands fn each key's values summed
// over CPUs. It reads in batches and falls back to a key-by-key walk when
// the kernel has no batch operations (before 5.6) or refuses them.
func sumPerCPU[K, V any, P interface {
	*V
	Add(*V)
}](m *ebpf.Map, fn func(K, *V)) error {
	handed, err := sumPerCPUBatch[K, V, P](m, fn)
	if err == nil {
		return nil
	}
	if handed > 0 {
		// Falling back now would hand some keys twice.
		return err
	}
	if !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSPC) {
		return err
	}
	return sumPerCPUIterate[K, V, P](m, fn)
}

// sumPerCPUBatch reads m with batch lookups; it returns how many keys it
// handed to fn, so a caller knows whether a fallback is still safe.
func sumPerCPUBatch[K, V any, P interface {
	*V
	Add(*V)
}](m *ebpf.Map, fn func(K, *V)) (int, error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return 0, fmt.Errorf("possible CPUs: %w", err)
	}
	chunk := min(int(m.MaxEntries()), batchKeys)
	keys := make([]K, chunk)
	vals := make([]V, chunk*ncpu)
	var (
		cursor ebpf.MapBatchCursor
		handed int
	)
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		done := errors.Is(err, ebpf.ErrKeyNotExist)
		if err != nil && !done {
			return handed, fmt.Errorf("batch lookup %s: %w", m, err)
		}
		for i := range n {
			var sum V
			for c := range ncpu {
				P(&sum).Add(&vals[i*ncpu+c])
			}
			fn(keys[i], &sum)
		}
		handed += n
		if done {
			return handed, nil
		}
	}
}

// sumPerCPUIterate is the key-by-key walk of kernels without batch lookups.
func sumPerCPUIterate[K, V any, P interface {
	*V
	Add(*V)
}](m *ebpf.Map, fn func(K, *V)) error {
	var (
		k    K
		cpus []V
	)
	it := m.Iterate()
	for it.Next(&k, &cpus) {
		var sum V
		for i := range cpus {
			P(&sum).Add(&cpus[i])
		}
		fn(k, &sum)
	}
	return it.Err()
}

// Drops sums the per-CPU drop counters.
func (s MapSource) Drops() ([bpfobj.NumDrops]uint64, error) {
	var out [bpfobj.NumDrops]uint64
	for i := range out {
		var cpus []uint64
		if err := s.Objects.Drops.Lookup(uint32(i), &cpus); err != nil {
			return out, fmt.Errorf("lookup drop counter %d: %w", i, err)
		}
		for _, v := range cpus {
			out[i] += v
		}
	}
	return out, nil
}

// DeletePIDs removes the keys of exited processes from every map. It
// runs only when a process has exited, so the full scan of malloc_sizes
// is not paid on every drain.
func (s MapSource) DeletePIDs(pids map[uint32]bool) error {
	_, err1 := deleteWhere(s.Objects.Aggregated, func(k *bpfobj.ProfiAggKey) bool { return pids[k.Pid] })
	_, err2 := deleteWhere(s.Objects.LaunchAgg, func(k *bpfobj.ProfiLaunchKey) bool { return pids[k.Pid] })
	_, err3 := deleteWhere(s.Objects.MallocSizes, func(k *bpfobj.ProfiAllocKey) bool { return pids[k.Pid] })
	_, err5 := deleteWhere(s.Objects.NcclAgg, func(k *bpfobj.ProfiNcclKey) bool { return pids[k.Pid] })
	_, err6 := deleteWhere(s.Objects.NcclComms, func(k *bpfobj.ProfiNcclCommKey) bool { return pids[k.Pid] })
	_, err7 := deleteWhere(s.Objects.NcclInflight, func(tid *uint64) bool { return pids[uint32(*tid>>32)] })
	gone := func(pid uint32) bool { return pids[pid] }
	errs := []error{err1, err2, err3, err5, err6, err7, s.deleteThreads(gone), s.deleteGraphs(gone), s.deleteQuotas(gone)}
	// A stale claim would make a new process that reuses the PID invisible until the next scan.
	_, err4 := deleteWhere(s.Objects.PidClaim, func(k *bpfobj.ProfiClaimKey) bool { return pids[k.Pid] })
	errs = append(errs, err4)
	return errors.Join(errs...)
}

// DeleteDead sweeps malloc_sizes and pid_claim for entries of exited processes.
func (s MapSource) DeleteDead(alive func(pid uint32) bool) (int, error) {
	dead := map[uint32]bool{}
	isDead := func(pid uint32) bool {
		d, ok := dead[pid]
		if !ok {
			d = !alive(pid)
			dead[pid] = d
		}
		return d
	}
	n1, err1 := deleteWhere(s.Objects.MallocSizes, func(k *bpfobj.ProfiAllocKey) bool { return isDead(k.Pid) })
	n2, err2 := deleteWhere(s.Objects.PidClaim, func(k *bpfobj.ProfiClaimKey) bool { return isDead(k.Pid) })
	// In-flight NCCL calls of processes that exited without the exit hook
	// (raw tracepoint unavailable) would otherwise look hung forever.
	n3, err3 := deleteWhere(s.Objects.NcclInflight, func(tid *uint64) bool { return isDead(uint32(*tid >> 32)) })
	return n1 + n2 + n3, errors.Join(err1, err2, err3, s.deleteThreads(isDead), s.deleteGraphs(isDead), s.deleteQuotas(isDead))
}

// deleteThreads removes the per-thread entries (nvtx_stack) of processes
// for which gone is true: thread_exit deletes each thread's own, and these
// are what a missing exit hook left behind. threads (the device and the
// runtime marker) is task storage: the kernel frees it with the thread.
func (s MapSource) deleteThreads(gone func(pid uint32) bool) error {
	_, err := deleteWhere(s.Objects.NvtxStack, func(id *uint64) bool { return gone(uint32(*id >> 32)) })
	return err
}

// deleteGraphs removes the CUDA graph state of processes for which gone is
// true: captures, graphs, executable graphs, nodes and replays.
// (A capture left open by a process that died counts on in live_captures,
// which then only spares fewer launches a lookup.)
func (s MapSource) deleteGraphs(gone func(pid uint32) bool) error {
	handle := func(k *bpfobj.ProfiHandleKey) bool { return gone(k.Pid) }
	var errs []error
	for _, m := range []*ebpf.Map{s.Objects.CaptureStreams, s.Objects.Captures, s.Objects.CaptureEvents, s.Objects.GraphIds, s.Objects.GraphExecs} {
		_, err := deleteWhere(m, handle)
		errs = append(errs, err)
	}
	_, err1 := deleteWhere(s.Objects.GraphNodes, func(k *bpfobj.ProfiGraphNodeKey) bool { return gone(k.Pid) })
	_, err2 := deleteWhere(s.Objects.GraphReplays, func(k *bpfobj.ProfiReplayKey) bool { return gone(k.Pid) })
	return errors.Join(append(errs, err1, err2)...)
}

// deleteQuotas removes the per-process quotas (pid_quotas) and admitted
// streams (pid_streams) of processes for which gone is true, after their
// keys: a new process reusing the PID starts afresh. What each still held
// is given back to its tenant (tenant_returned: BPF writes tenant_quotas
// with atomic adds, which a write from here would undo) and to the node
// (node_returned). A tenant with no
// process left that holds nothing is deleted.
func (s MapSource) deleteQuotas(gone func(pid uint32) bool) error {
	_, err1 := deleteWhere(s.Objects.PidStreams, func(k *bpfobj.ProfiHandleKey) bool { return gone(k.Pid) })
	back := map[uint64]*bpfobj.ProfiTenantQuota{}
	live := map[uint64]bool{}
	err2 := each(s.Objects.PidQuotas, func(pid uint32, q *bpfobj.ProfiPidQuota) {
		if !gone(pid) {
			live[q.Tenant] = true
			return
		}
		b := back[q.Tenant]
		if b == nil {
			b = &bpfobj.ProfiTenantQuota{}
			back[q.Tenant] = b
		}
		for m, n := range q.Keys {
			b.Keys[m] += n
		}
	})
	if err2 != nil {
		return errors.Join(err1, err2)
	}
	_, err3 := deleteWhere(s.Objects.PidQuotas, func(pid *uint32) bool { return gone(*pid) })
	if err3 != nil {
		// Not given back: a quota left in place gives its units back at the next sweep.
		return errors.Join(err1, err3)
	}
	var errs []error
	var node [bpfobj.NumQuotaMaps]uint32
	for _, b := range back {
		for m, n := range b.Keys {
			node[m] += n
		}
	}
	errs = append(errs, s.giveBackNode(node))
	for tenant, b := range back {
		var r bpfobj.ProfiTenantQuota
		if err := s.Objects.TenantReturned.Lookup(tenant, &r); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("lookup tenant_returned: %w", err))
			continue
		}
		for m := range r.Keys {
			r.Keys[m] += b.Keys[m]
		}
		if err := s.Objects.TenantReturned.Put(tenant, &r); err != nil {
			errs = append(errs, fmt.Errorf("give back units of tenant %#x: %w", tenant, err))
		}
	}
	return errors.Join(append(errs, err1, s.deleteIdleTenants(live))...)
}

// giveBackNode adds units to node_returned, the node's count of units
// userspace gave back (bpf/quota.h take_shared): only this goroutine
// writes it, in a section of its own, so a read-add-write loses nothing.
func (s MapSource) giveBackNode(units [bpfobj.NumQuotaMaps]uint32) error {
	if units == ([bpfobj.NumQuotaMaps]uint32{}) {
		return nil
	}
	var r [bpfobj.NumQuotaMaps]uint32
	if err := s.Objects.NodeReturned.Get(&r); err != nil {
		return fmt.Errorf("read node_returned: %w", err)
	}
	for m := range r {
		r[m] += units[m]
	}
	if err := s.Objects.NodeReturned.Set(r); err != nil {
		return fmt.Errorf("give back units to the node: %w", err)
	}
	return nil
}

// deleteIdleTenants deletes the entries of tenants that hold nothing and
// have no process in pid_quotas (live). A process of such a tenant that
// takes its first unit between the two reads and the delete loses that
// count (at most one process's keys: BPF then treats the tenant as
// holding nothing rather than less than nothing).
func (s MapSource) deleteIdleTenants(live map[uint64]bool) error {
	var idle []uint64
	err := each(s.Objects.TenantQuotas, func(tenant uint64, t *bpfobj.ProfiTenantQuota) {
		if live[tenant] {
			return
		}
		var r bpfobj.ProfiTenantQuota
		_ = s.Objects.TenantReturned.Lookup(tenant, &r) // absent: nothing returned
		if t.Keys == r.Keys {
			idle = append(idle, tenant)
		}
	})
	for _, tenant := range idle {
		// Returns first: in between, BPF sees the tenant fuller than it is, never emptier.
		for _, m := range []*ebpf.Map{s.Objects.TenantReturned, s.Objects.TenantQuotas} {
			if e := m.Delete(tenant); e != nil && !errors.Is(e, ebpf.ErrKeyNotExist) {
				err = errors.Join(err, fmt.Errorf("delete tenant %#x from %s: %w", tenant, m, e))
			}
		}
	}
	return err
}

// deleteWhere collects matching keys first and deletes them afterwards,
// because deleting the current key would restart a NextKey walk.
func deleteWhere[K any](m *ebpf.Map, match func(*K) bool) (int, error) {
	var (
		keys      []K
		cur, next K
		prev      any // nil asks for the first key
	)
	for range m.MaxEntries() + 1 {
		err := m.NextKey(prev, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("walk %s: %w", m, err)
		}
		if match(&next) {
			keys = append(keys, next)
		}
		cur = next
		prev = &cur
	}
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return i, fmt.Errorf("delete from %s: %w", m, err)
		}
	}
	return len(keys), nil
}
