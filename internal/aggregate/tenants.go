package aggregate

import (
	"fmt"
	"sort"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// TenantRefusals are the new keys BPF refused a tenant (bpf/quota.h
// take_shared: the node past its room and the tenant at its guarantee),
// by shared map (bpfobj.QuotaMapNames), since the agent started.
type TenantRefusals struct {
	// Tenant is BPF's tenant id: a cgroup v2 id, or TENANT_PID | pid for
	// a process in the root cgroup (docs/METRICS.md, "Shares of the
	// shared maps").
	Tenant uint64
	// Namespace, Pod and Container label the tenant by one of its
	// processes (empty until one is known).
	Namespace, Pod, Container string
	Refused                   [bpfobj.NumQuotaMaps]uint64
}

// maxTenants bounds the tenants the aggregator keeps refusals of (a
// process that creates cgroups makes tenants at will): the refusals of
// tenants past it are added to the one with Tenant OtherTenant.
const maxTenants = 256

// OtherTenant is the tenant id of refusals of tenants past maxTenants
// (never a BPF tenant: cgroup ids 0 and 1 are not tenants).
const OtherTenant = 0

// tenantState is what the aggregator keeps of a tenant: BPF's count at
// the last read (a tenant entry userspace deleted and BPF created again
// counts from 0) and the total since the agent started.
type tenantState struct {
	last   [bpfobj.NumQuotaMaps]uint32
	seenAt time.Time    // the last drain that found it in tenant_quotas
	sum    *tenantState // past maxTenants: the OtherTenant entry its refusals go to
	TenantRefusals
}

// otherTenant returns the entry of the tenants past maxTenants.
func (a *Aggregator) otherTenant() *tenantState {
	if a.tenantsOther == nil {
		a.tenantsOther = &tenantState{TenantRefusals: TenantRefusals{Tenant: OtherTenant}}
	}
	return a.tenantsOther
}

// readTenants adds each tenant's refusals since the last drain
// (tenant_quotas) and labels the tenant by one of its live processes
// (pid_quotas). Called before the drain deletes exited processes'
// quotas, so that a tenant is read once more after its last process
// exits. A tenant BPF forgot keeps its totals for RetainedExpiry.
func (a *Aggregator) readTenants(snap *Snapshot) error {
	now := a.opts.Now()
	err := a.opts.Source.Tenants(func(tenant uint64, q *bpfobj.ProfiTenantQuota) {
		t := a.tenants[tenant]
		if t == nil {
			if q.Refused == ([bpfobj.NumQuotaMaps]uint32{}) {
				return // nothing refused: no series
			}
			t = &tenantState{TenantRefusals: TenantRefusals{Tenant: tenant}}
			if len(a.tenants) >= maxTenants {
				t.sum = a.otherTenant()
			}
			a.tenants[tenant] = t
		}
		t.seenAt = now
		to := &t.TenantRefusals
		if t.sum != nil {
			to = &t.sum.TenantRefusals
		}
		for m, n := range q.Refused {
			if n >= t.last[m] {
				to.Refused[m] += uint64(n - t.last[m])
			} else {
				to.Refused[m] += uint64(n) // deleted and created again
			}
			t.last[m] = n
		}
	})
	if err != nil {
		return fmt.Errorf("read tenant_quotas: %w", err)
	}
	// Tenants BPF forgot (no process left, nothing held): those past the
	// bound at once (their totals are in OtherTenant's), the others'
	// series RetainedExpiry later, as exited processes' are.
	for tenant, t := range a.tenants {
		if gone := t.seenAt != now; gone && (t.sum != nil || now.Sub(t.seenAt) > RetainedExpiry) {
			delete(a.tenants, tenant)
		}
	}
	if len(a.tenants) > 0 {
		err = a.opts.Source.Quotas(func(pid uint32, q bpfobj.ProfiPidQuota) {
			t := a.tenants[q.Tenant]
			ps := a.procs[int(pid)]
			if t == nil || t.sum != nil || ps == nil || t.Pod != "" {
				return
			}
			t.Namespace, t.Pod, t.Container = ps.meta.Namespace, ps.meta.Pod, ps.meta.Container
		})
		if err != nil {
			return fmt.Errorf("read pid_quotas: %w", err)
		}
	}
	snap.TenantRefusals = make([]TenantRefusals, 0, len(a.tenants)+1)
	for _, t := range a.tenants {
		if t.sum == nil {
			snap.TenantRefusals = append(snap.TenantRefusals, t.TenantRefusals)
		}
	}
	if a.tenantsOther != nil {
		snap.TenantRefusals = append(snap.TenantRefusals, a.tenantsOther.TenantRefusals)
	}
	sort.Slice(snap.TenantRefusals, func(i, j int) bool { return snap.TenantRefusals[i].Tenant < snap.TenantRefusals[j].Tenant })
	return nil
}
