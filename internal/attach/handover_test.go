package attach

import (
	"maps"
	"slices"
	"testing"

	"github.com/profi-dev/profi/internal/ops"
)

// TestDecide is the handover rule against an explicit table of what BPF
// learned (rt_ops, rt_sites) and what must be handed to the driver.
func TestDecide(t *testing.T) {
	var (
		launch = ops.OpCudaLaunchKernel
		ptsz   = ops.OpCudaLaunchKernelPtsz
		handle = ops.OpCudaLaunchKernelHandle
		exc    = ops.OpCudaLaunchKernelExC
	)
	site := func(off uint64, drv ops.Op) rtSite { return rtSite{File: 1, DrvOp: uint32(drv), Off: off} }
	one := func(op ops.Op) siteOps { return siteOps{ops: map[ops.Op]bool{op: true}} }
	probes := []ops.Op{launch, ptsz, handle, exc}
	tests := []struct {
		name     string
		stats    map[ops.Op]opStats
		sites    map[rtSite]siteOps
		driverOK bool
		handed   []ops.Op
		counted  int
		settled  bool
	}{
		{name: "nothing seen"},
		{
			name:     "every launch reached the driver at its own site",
			stats:    map[ops.Op]opStats{launch: {merged: MinMerged}, ptsz: {merged: 40}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch), site(0x10, ops.OpCuLaunchKernelPtsz): one(ptsz)},
			driverOK: true,
			handed:   []ops.Op{launch, ptsz},
			counted:  2,
		},
		{
			name:     "too few launches yet",
			stats:    map[ops.Op]opStats{launch: {merged: MinMerged - 1}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch)},
			driverOK: true,
		},
		{
			name:     "a process without a probed driver",
			stats:    map[ops.Op]opStats{launch: {merged: 100}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch)},
			driverOK: false,
		},
		{
			name:     "one launch never reached the driver",
			stats:    map[ops.Op]opStats{launch: {merged: 100, unmerged: 1}, exc: {merged: 20}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(launch), site(0x20, ops.OpCuLaunchKernelEx): one(exc)},
			driverOK: true,
			handed:   []ops.Op{exc},
			counted:  1,
		},
		{
			name:     "another op still learning: not settled",
			stats:    map[ops.Op]opStats{launch: {unmerged: 1}, exc: {merged: 3}},
			sites:    map[rtSite]siteOps{site(0x20, ops.OpCuLaunchKernelEx): one(exc)},
			driverOK: true,
		},
		{
			name:     "a runtime that launches some other way settles",
			stats:    map[ops.Op]opStats{launch: {unmerged: 100}},
			driverOK: true,
			settled:  true,
		},
		{
			name:  "a site two ops share",
			stats: map[ops.Op]opStats{launch: {merged: 100}, handle: {merged: 100}},
			sites: map[rtSite]siteOps{
				site(0x10, ops.OpCuLaunchKernel): {ops: map[ops.Op]bool{launch: true, handle: true}},
			},
			driverOK: true,
			settled:  true,
		},
		{
			name:     "a site marked mixed",
			stats:    map[ops.Op]opStats{launch: {merged: 100}},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): {ops: map[ops.Op]bool{launch: true}, mixed: true}},
			driverOK: true,
			settled:  true,
		},
		{
			name: "CUDA 13: the tail-jump target goes with __cudaLaunchKernel",
			stats: map[ops.Op]opStats{
				handle: {merged: 100},
				launch: {tails: 100, tailOf: handle},
			},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(handle)},
			driverOK: true,
			handed:   []ops.Op{launch, handle},
			counted:  1,
		},
		{
			name: "a tail-jump target also called directly stays",
			stats: map[ops.Op]opStats{
				handle: {merged: 100},
				launch: {merged: 5, tails: 100, tailOf: handle},
			},
			sites: map[rtSite]siteOps{
				site(0x10, ops.OpCuLaunchKernel): {ops: map[ops.Op]bool{launch: true, handle: true}},
			},
			driverOK: true,
			settled:  true,
		},
		{
			name: "a tail-jump target whose caller is not handed stays",
			stats: map[ops.Op]opStats{
				handle: {merged: 3},
				launch: {tails: 3, tailOf: handle},
			},
			sites:    map[rtSite]siteOps{site(0x10, ops.OpCuLaunchKernel): one(handle)},
			driverOK: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := decide(probes, tc.stats, tc.sites, tc.driverOK)
			got := slices.Sorted(maps.Keys(plan.handed))
			want := slices.Sorted(slices.Values(tc.handed))
			if !slices.Equal(got, want) {
				t.Errorf("handed %v, want %v", got, want)
			}
			if len(plan.counted) != tc.counted {
				t.Errorf("counted sites %v, want %d", plan.counted, tc.counted)
			}
			if plan.settled != tc.settled {
				t.Errorf("settled %v, want %v", plan.settled, tc.settled)
			}
			for k, op := range plan.counted {
				if !tc.sites[k].ops[op] {
					t.Errorf("site %+v counted as %v, learned %v", k, op, tc.sites[k].ops)
				}
			}
		})
	}
}

// What a released runtime file learned is kept by file and adds up over its
// attachments (issue 33): a file attached again under a new id decides as
// if it had learned everything itself, and a replaced file (another
// identity) starts from nothing.
func TestLearnedOutlivesRelease(t *testing.T) {
	launch, ptsz := ops.OpCudaLaunchKernel, ops.OpCudaLaunchKernelPtsz
	key := FileKey{Dev: 1, Inode: 2}
	a := New(Options{})
	first := &attached{id: 1, target: Target{Key: key}, ident: fileIdent{size: 10, mtime: 1, ctime: 1}}
	a.remember(first,
		map[ops.Op]opStats{launch: {merged: 10}, ptsz: {merged: MinMerged}},
		map[rtSite]siteOps{{File: 1, DrvOp: uint32(ops.OpCuLaunchKernel), Off: 0x10}: {ops: map[ops.Op]bool{launch: true}},
			{File: 1, DrvOp: uint32(ops.OpCuLaunchKernelPtsz), Off: 0x20}: {ops: map[ops.Op]bool{ptsz: true}}})
	second := &attached{id: 7, target: Target{Key: key}, ident: first.ident, prior: a.learnedFiles[key]}
	st, si := withPrior(second, map[ops.Op]opStats{launch: {merged: MinMerged - 10}}, nil)
	plan := decide([]ops.Op{launch, ptsz}, st, si, true)
	if !plan.handed[launch] || !plan.handed[ptsz] || len(plan.counted) != 2 {
		t.Fatalf("plan %+v, want both ops handed at 2 sites", plan)
	}
	for k := range plan.counted {
		if k.File != 7 {
			t.Errorf("site %+v keyed by file %d, want the new id 7", k, k.File)
		}
	}
	a.remember(second, map[ops.Op]opStats{launch: {merged: MinMerged - 10}}, nil)
	if got := a.learnedFiles[key].stats[launch].merged; got != MinMerged {
		t.Errorf("kept %d merged launches, want %d (10 + %d)", got, MinMerged, MinMerged-10)
	}
	if got := a.learnedFiles[key].stats[ptsz].merged; got != MinMerged {
		t.Errorf("kept %d merged ptsz launches, want %d", got, MinMerged)
	}
	replaced := &attached{id: 8, target: Target{Key: key}, ident: fileIdent{size: 11, mtime: 2, ctime: 2},
		launches: map[ops.Op]*launchProbe{launch: {}}}
	a.priorHandover(replaced)
	if replaced.prior != nil || replaced.launches[launch].handed {
		t.Errorf("a replaced file started from its predecessor's learning")
	}
}
