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
