package testutil

import (
	"slices"
	"testing"

	"github.com/profi-dev/profi/internal/discover"
	"github.com/profi-dev/profi/internal/ops"
)

// unprobedCalls are the functions the workload calls and lists in its
// ground truth without a row in the operation table: set-up calls whose
// count the tests check only against the workload itself.
var unprobedCalls = []string{"cuInit", "cuLibraryLoadData", "cudaGetDevice"}

// unstubbedRows are the operation table's libcuda rows the driver stub
// does not export: optional variants, checked against NVIDIA's libcuda
// only (internal/ops TestTableAgainstNVIDIA).
var unstubbedRows = []string{
	"cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz", "cuMemcpyDtoDAsync_v2_ptsz", "cuMemcpyDtoD_v2_ptds",
	"cuMemcpyDtoHAsync_v2_ptsz", "cuMemcpyDtoH_v2_ptds", "cuMemcpyHtoD_v2_ptds", "cuMemcpyPeerAsync",
	"cuMemcpy_ptds", "cuMemsetD16Async", "cuMemsetD16Async_ptsz", "cuMemsetD16_v2_ptds",
	"cuMemsetD32Async_ptsz", "cuMemsetD32_v2_ptds", "cuMemsetD8Async", "cuMemsetD8Async_ptsz",
	"cuMemsetD8_v2_ptds", "cuMemsetD2D8Async", "cuMemsetD2D16Async", "cuMemsetD2D8_v2_ptds",
	"cuMemsetD2D16_v2_ptds", "cuMemsetD2D32_v2_ptds", "cuMemsetD2D8Async_ptsz", "cuMemsetD2D16Async_ptsz",
	"cuMemsetD2D32Async_ptsz", "cuMemcpy2D_v2_ptds", "cuMemcpy2DUnaligned_v2_ptds", "cuMemcpy2DAsync_v2_ptsz",
	"cuMemcpy3D_v2_ptds", "cuMemcpy3DAsync_v2_ptsz", "cuMemcpy3DPeer_ptds", "cuMemcpy3DPeerAsync_ptsz",
	"cuMemAllocFromPoolAsync_ptsz",
}

func tableRow(symbol string) (ops.Row, bool) {
	i := slices.IndexFunc(ops.Table, func(r ops.Row) bool { return r.Symbol == symbol })
	if i < 0 {
		return ops.Row{}, false
	}
	return ops.Table[i], true
}

// TestFuncListsFollowTable: the workload's function lists restate the
// operation table (internal/ops); a row renamed, moved to another library
// or given another base, or a listed function losing its row, fails here
// rather than in an e2e test's mismatched counts.
func TestFuncListsFollowTable(t *testing.T) {
	for _, l := range []struct {
		name string
		fns  []string
		lib  discover.Library
	}{
		{"ProbedFuncs", ProbedFuncs, discover.LibCudart},
		{"ExtraFuncs", ExtraFuncs, discover.LibCudart},
		{"PtszFuncs", PtszFuncs, discover.LibCudart},
		{"DriverFuncs", DriverFuncs, discover.LibCuda},
		{"StreamFuncs", StreamFuncs, discover.LibCudart},
	} {
		for _, fn := range l.fns {
			r, ok := tableRow(fn)
			switch {
			case slices.Contains(unprobedCalls, fn):
				if ok {
					t.Errorf("%s has a table row now: remove it from unprobedCalls", fn)
				}
			case !ok:
				t.Errorf("%s lists %s, which has no row in internal/ops/table.go", l.name, fn)
			case r.Lib != l.lib:
				t.Errorf("%s lists %s, a %s row; want %s", l.name, fn, r.Lib, l.lib)
			}
		}
	}
	for _, fn := range PtszFuncs {
		if r, ok := tableRow(fn); ok && (r.Base == "" || PtszBase[fn] != r.Base) {
			t.Errorf("PtszBase[%s] = %q, the table's base %q", fn, PtszBase[fn], r.Base)
		}
	}
	for _, fn := range unstubbedRows {
		if r, ok := tableRow(fn); !ok || !r.Optional {
			t.Errorf("unstubbedRows lists %s: not an optional table row (found: %v)", fn, ok)
		}
		if slices.Contains(driverExports, fn) {
			t.Errorf("unstubbedRows lists %s, which the driver stub exports", fn)
		}
	}
}

// TestStubsExportTable: every libcudart and libcuda row of the operation
// table is a function a stub exports (the export lists TestStubELF holds
// the stubs to), or an optional row named in unstubbedRows. A new row
// without its stub export fails here.
func TestStubsExportTable(t *testing.T) {
	for _, r := range ops.Table {
		var exported bool
		switch r.Lib {
		case discover.LibCudart:
			exported = slices.Contains(exportedFuncs, r.Symbol) || slices.Contains(cuda13Funcs, r.Symbol)
		case discover.LibCuda:
			exported = slices.Contains(driverExports, r.Symbol) || slices.Contains(unstubbedRows, r.Symbol)
		default:
			continue
		}
		if !exported {
			t.Errorf("%s (%s) is a table row no stub exports: export it from test/stubs (docs/PROBES.md, \"Adding a function\")", r.Symbol, r.Lib)
		}
	}
}
