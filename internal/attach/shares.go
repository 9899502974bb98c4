package attach

import (
	"strconv"

	"github.com/profi-dev/profi/internal/bpfobj"
)

// Shares of the attach budget (issue 47 item 1; docs/OPERATIONS.md,
// "Shares of the attach budget"). The node's caps on files
// (--max-attached-files) and links (--max-probe-descriptors,
// --max-teardown: cost.go) are work-conserving, as the shared BPF maps'
// are (bpf/quota.h): up to seven eighths of a cap, its room, anyone
// takes; the last eighth, the reserve, goes only to a tenant holding less
// than its guarantee (half the reserve). So the processes that came first
// cannot keep a newcomer's library unprobed: 17 processes mapping 64
// copies of a runtime each took all 1,023 attachable files, and a victim
// started after them was not probed at all. The tenant is the pod
// (Options.TenantOf reads it from /proc: a process whose library is not
// attached has made no probed call, so BPF has not seen it).

// share is one cap's room and guarantee, by the rule of the BPF maps'
// shares (bpfobj.Share) with a reserve of at least one; a cap of 0 is
// none, a room of 0 shares nothing (the cap alone).
type share struct{ cap, room, guarantee int }

func shareOf(limit int) share {
	room, reserve := bpfobj.Share(uint64(max(limit, 0)), 1)
	return share{cap: limit, room: int(room), guarantee: max(int(reserve)/2, 1)}
}

// admits reports whether n more units fit when held are held: within the
// room for anyone; past it, within the cap, for a tenant below its
// guarantee (below is asked only then).
func (s share) admits(held, n int, below func(guarantee int) bool) bool {
	switch {
	case s.cap <= 0 || held+n <= s.room:
		return true
	case held+n > s.cap:
		return false
	case s.room == 0:
		return true
	default:
		return below(s.guarantee)
	}
}

// tenantOf is pid's tenant: Options.TenantOf's, remembered for the pass
// (the processes' cgroups are read once per pass), else the process.
func (a *Attacher) tenantOf(pid int) string {
	if a.opts.TenantOf == nil {
		return "pid:" + strconv.Itoa(pid)
	}
	if t, ok := a.tenantMemo[pid]; ok {
		return t
	}
	if a.tenantMemo == nil {
		a.tenantMemo = map[int]string{}
	}
	t := a.opts.TenantOf(pid)
	if t == "" {
		t = "pid:" + strconv.Itoa(pid)
	}
	a.tenantMemo[pid] = t
	return t
}

// tenantsOf are the distinct tenants of pids.
func tenantsOf(pids []int, of func(pid int) string) []string {
	seen := make(map[string]bool, len(pids))
	var out []string
	for _, pid := range pids {
		if tn := of(pid); !seen[tn] {
			seen[tn] = true
			out = append(out, tn)
		}
	}
	return out
}

// linkHoldings are the links each tenant's processes map (a file several
// tenants map counts for each). Called with a.mu held.
func (a *Attacher) linkHoldings() map[string]int {
	links := map[string]int{}
	for _, f := range a.files {
		n := f.allLinks()
		for _, tn := range tenantsOf(f.target.PIDs, a.tenantOf) {
			links[tn] += n
		}
	}
	return links
}

// belowGuarantee reports whether some process of pids belongs to a tenant
// holding fewer than guarantee units of what held counts.
func (a *Attacher) belowGuarantee(pids []int, held map[string]int, guarantee int) bool {
	for _, pid := range pids {
		if held[a.tenantOf(pid)] < guarantee {
			return true
		}
	}
	return false
}
