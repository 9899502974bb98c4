package aggregate

import (
	"testing"
	"time"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
)

// A tenant's refusals (issue 47 item 1: every refusal counted, per tenant
// and map): added up from BPF's counts across drains, also after
// userspace deleted the tenant's entry and BPF created it again (its count
// starting from 0); labelled by one of its processes; tenants that were
// refused nothing make no entry; past maxTenants, refusals go to
// OtherTenant; a tenant BPF forgot keeps its series RetainedExpiry.
// Values worked out by hand.
func TestTenantRefusals(t *testing.T) {
	src := newFakeSource()
	procs := newFakeProcs(map[int]fakeProc{7: {"server", 1}})
	clock := &fakeClock{t: time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)}
	a := New(Options{Source: src, Procs: procs, Now: clock.now})
	const tenant = 4242
	src.add(akey(7, ops.OpCudaGraphLaunch, 0, 0, 0), bpfobj.ProfiAggVal{Count: 1}) // makes pid 7 known
	src.quotas = map[uint32]bpfobj.ProfiPidQuota{7: {Tenant: tenant}}
	refused := func(agg, launch uint32) bpfobj.ProfiTenantQuota {
		var q bpfobj.ProfiTenantQuota
		q.Refused[bpfobj.QuotaAggregated], q.Refused[bpfobj.QuotaLaunchAgg] = agg, launch
		return q
	}
	src.tenants = map[uint64]bpfobj.ProfiTenantQuota{tenant: refused(3, 0), 99: {}}
	drain(t, a)
	src.tenants[tenant] = refused(5, 2)
	s := drain(t, a)
	if len(s.TenantRefusals) != 1 {
		t.Fatalf("tenants %+v, want only %d (99 was refused nothing)", s.TenantRefusals, tenant)
	}
	got := s.TenantRefusals[0]
	if got.Tenant != tenant || got.Refused[bpfobj.QuotaAggregated] != 5 || got.Refused[bpfobj.QuotaLaunchAgg] != 2 {
		t.Fatalf("tenant %+v, want 5 aggregated and 2 launch_agg refusals", got)
	}
	// Deleted by userspace, created again by BPF: 1 more, on top of 5.
	src.tenants[tenant] = refused(1, 2)
	if got := drain(t, a).TenantRefusals[0]; got.Refused[bpfobj.QuotaAggregated] != 6 || got.Refused[bpfobj.QuotaLaunchAgg] != 2 {
		t.Fatalf("after the entry came back: %+v, want 6 and 2", got)
	}
	// Past the bound, the rest go to OtherTenant.
	for i := range maxTenants + 10 {
		src.tenants[uint64(10000+i)] = refused(1, 0)
	}
	s = drain(t, a)
	var other, sum uint64
	for _, r := range s.TenantRefusals {
		sum += r.Refused[bpfobj.QuotaAggregated]
		if r.Tenant == OtherTenant {
			other = r.Refused[bpfobj.QuotaAggregated]
		}
	}
	if len(s.TenantRefusals) != maxTenants+1 || other != 11 || sum != 6+maxTenants+10 {
		t.Fatalf("%d tenants, other %d, sum %d; want %d, 11, %d", len(s.TenantRefusals), other, sum, maxTenants+1, 6+maxTenants+10)
	}
	// BPF forgets them all: their series stay RetainedExpiry, other's for good.
	clear(src.tenants)
	clock.t = clock.t.Add(time.Second)
	if n := len(drain(t, a).TenantRefusals); n != maxTenants+1 {
		t.Fatalf("just forgotten: %d tenants, want %d", n, maxTenants+1)
	}
	clock.t = clock.t.Add(RetainedExpiry + time.Second)
	if got := drain(t, a).TenantRefusals; len(got) != 1 || got[0].Tenant != OtherTenant || got[0].Refused[bpfobj.QuotaAggregated] != 11 {
		t.Fatalf("after RetainedExpiry: %+v, want only other's 11", got)
	}
}
