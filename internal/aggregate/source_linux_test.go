//go:build linux

package aggregate

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/profi-dev/profi/internal/bpfobj"
	"github.com/profi-dev/profi/internal/ops"
	"github.com/profi-dev/profi/internal/testutil"
)

// newMapSource creates the maps of the embedded object (no programs) and
// returns them as a MapSource.
func newMapSource(t *testing.T) MapSource {
	t.Helper()
	testutil.RequireBPF(t)
	spec, err := bpfobj.LoadProfi()
	if err != nil {
		t.Fatal(err)
	}
	// Keep the sized maps small; the test needs few keys.
	for _, name := range []string{bpfobj.ProfiMapAggregated, bpfobj.ProfiMapLaunchAgg, bpfobj.ProfiMapMallocSizes} {
		spec.Maps[name].MaxEntries = 64
	}
	objs := &bpfobj.Objects{}
	// Only the maps are created: no program is loaded.
	if err := spec.LoadAndAssign(&objs.ProfiMaps, nil); err != nil {
		t.Fatalf("create maps: %v", err)
	}
	t.Cleanup(func() { objs.ProfiMaps.Close() })
	return MapSource{Objects: objs}
}

func TestMapSourceSumsCPUs(t *testing.T) {
	src := newMapSource(t)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	objs := src.Objects

	// CPU i holds i+1 calls (and so on), so the sums are exact and every CPU counts.
	var wantAgg bpfobj.ProfiAggVal
	aggCPUs := make([]bpfobj.ProfiAggVal, ncpu)
	var wantLaunch bpfobj.ProfiLaunchVal
	launchCPUs := make([]bpfobj.ProfiLaunchVal, ncpu)
	wantDrops := [bpfobj.NumDrops]uint64{}
	for i := range ncpu {
		n := uint64(i + 1)
		v := &aggCPUs[i]
		v.Count, v.DurationNs, v.Bytes = n, 1000*n, 10*n
		for b := range v.Buckets {
			v.Buckets[b] = n * uint64(b)
		}
		wantAgg.Count += v.Count
		wantAgg.DurationNs += v.DurationNs
		wantAgg.Bytes += v.Bytes
		for b := range v.Buckets {
			wantAgg.Buckets[b] += v.Buckets[b]
		}
		l := &launchCPUs[i]
		l.Count, l.GridBlocks, l.BlockThreads, l.SharedBytes = n, 2*n, 3*n, 4*n
		wantLaunch.Count += l.Count
		wantLaunch.GridBlocks += l.GridBlocks
		wantLaunch.BlockThreads += l.BlockThreads
		wantLaunch.SharedBytes += l.SharedBytes
	}
	ak := akey(100, ops.OpCudaMemcpy, 1, 0, 0x10)
	if err := objs.Aggregated.Put(ak, aggCPUs); err != nil {
		t.Fatal(err)
	}
	lk := lkey(100, 0x20)
	if err := objs.LaunchAgg.Put(lk, launchCPUs); err != nil {
		t.Fatal(err)
	}
	for d := range bpfobj.NumDrops {
		cpus := make([]uint64, ncpu)
		for i := range cpus {
			cpus[i] = uint64(d) + uint64(i)
			wantDrops[d] += cpus[i]
		}
		if err := objs.Drops.Put(uint32(d), cpus); err != nil {
			t.Fatal(err)
		}
	}

	gotAgg := map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{}
	if err := src.Aggregated(func(k bpfobj.ProfiAggKey, v *bpfobj.ProfiAggVal) { gotAgg[k] = *v }); err != nil {
		t.Fatal(err)
	}
	if want := map[bpfobj.ProfiAggKey]bpfobj.ProfiAggVal{ak: wantAgg}; !reflect.DeepEqual(gotAgg, want) {
		t.Errorf("Aggregated = %+v, want %+v", gotAgg, want)
	}
	gotLaunch := map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{}
	if err := src.Launches(func(k bpfobj.ProfiLaunchKey, v *bpfobj.ProfiLaunchVal) { gotLaunch[k] = *v }); err != nil {
		t.Fatal(err)
	}
	if want := map[bpfobj.ProfiLaunchKey]bpfobj.ProfiLaunchVal{lk: wantLaunch}; !reflect.DeepEqual(gotLaunch, want) {
		t.Errorf("Launches = %+v, want %+v", gotLaunch, want)
	}
	drops, err := src.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if drops != wantDrops {
		t.Errorf("Drops = %v, want %v", drops, wantDrops)
	}
}

func TestMapSourceDeletePIDs(t *testing.T) {
	src := newMapSource(t)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	objs := src.Objects
	// Enough keys of the deleted PIDs that a delete during the walk would restart it.
	for pid := uint32(1); pid <= 4; pid++ {
		for op := range uint32(5) {
			if err := objs.Aggregated.Put(akey(pid, ops.Op(op), 0, 0, 0), make([]bpfobj.ProfiAggVal, ncpu)); err != nil {
				t.Fatal(err)
			}
			if err := objs.MallocSizes.Put(bpfobj.ProfiAllocKey{Pid: pid, Ptr: uint64(op) << 12}, bpfobj.ProfiAllocVal{Size: 64}); err != nil {
				t.Fatal(err)
			}
		}
		if err := objs.LaunchAgg.Put(lkey(pid, 0), make([]bpfobj.ProfiLaunchVal, ncpu)); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.DeletePIDs(map[uint32]bool{2: true, 4: true}); err != nil {
		t.Fatal(err)
	}
	pidsIn := func(m *ebpf.Map, pidOf func([]byte) uint32) map[uint32]int {
		out := map[uint32]int{}
		var prev any // nil asks for the first key
		for {
			next := make([]byte, m.KeySize())
			err := m.NextKey(prev, &next)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return out
			}
			if err != nil {
				t.Fatal(err)
			}
			out[pidOf(next)]++
			prev = next
		}
	}
	// The pid is the first u32 of every key (little-endian on the hosts we build for).
	pidOf := func(k []byte) uint32 { return uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24 }
	for _, tc := range []struct {
		name string
		m    *ebpf.Map
		want map[uint32]int
	}{
		{"aggregated", objs.Aggregated, map[uint32]int{1: 5, 3: 5}},
		{"launch_agg", objs.LaunchAgg, map[uint32]int{1: 1, 3: 1}},
		{"malloc_sizes", objs.MallocSizes, map[uint32]int{1: 5, 3: 5}},
	} {
		if got := pidsIn(tc.m, pidOf); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s keys by pid = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSumPerCPUBatchMatchesIterate fills a per-CPU hash with more keys
// than one batch holds and checks that the batch read hands every key
// once with the exact per-CPU sums, the same as the key-by-key walk.
func TestSumPerCPUBatchMatchesIterate(t *testing.T) {
	testutil.RequireBPF(t)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	const keys = 3*batchKeys + 7
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 4, ValueSize: 8, MaxEntries: 4 * batchKeys})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := map[uint32]uint64{}
	for k := range uint32(keys) {
		cpus := make([]uint64, ncpu)
		for c := range cpus {
			cpus[c] = uint64(k)*1000 + uint64(c) + 1
			want[k] += cpus[c]
		}
		if err := m.Put(k, cpus); err != nil {
			t.Fatal(err)
		}
	}
	collect := func(read func(*ebpf.Map, func(uint32, *sumU64)) error) map[uint32]uint64 {
		got := map[uint32]uint64{}
		if err := read(m, func(k uint32, v *sumU64) {
			if _, dup := got[k]; dup {
				t.Errorf("key %d handed twice", k)
			}
			got[k] = uint64(*v)
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	batch := func(m *ebpf.Map, fn func(uint32, *sumU64)) error {
		_, err := sumPerCPUBatch[uint32, sumU64](m, fn)
		return err
	}
	if got := collect(batch); !reflect.DeepEqual(got, want) {
		t.Errorf("batch read: %d keys, want %d (or wrong sums)", len(got), len(want))
	}
	if got := collect(sumPerCPUIterate[uint32, sumU64]); !reflect.DeepEqual(got, want) {
		t.Errorf("iterate: %d keys, want %d (or wrong sums)", len(got), len(want))
	}
}

// sumU64 is a per-CPU value that sums.
type sumU64 uint64

func (s *sumU64) Add(o *sumU64) { *s += *o }

// BenchmarkSumPerCPU reads a 5·10⁴-key per-CPU hash (the 50k-series
// level of bench/scale_test.go) in batches and key by key.
func BenchmarkSumPerCPU(b *testing.B) {
	testutil.RequireBPF(b)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		b.Fatal(err)
	}
	const keys = 50_000
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 4, ValueSize: uint32(binarySizeAggVal), MaxEntries: keys})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	cpus := make([]bpfobj.ProfiAggVal, ncpu)
	for k := range uint32(keys) {
		if err := m.Put(k, cpus); err != nil {
			b.Fatal(err)
		}
	}
	fn := func(uint32, *bpfobj.ProfiAggVal) {}
	b.Run("batch", func(b *testing.B) {
		for b.Loop() {
			if err := sumPerCPU(m, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("iterate", func(b *testing.B) {
		for b.Loop() {
			if err := sumPerCPUIterate(m, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}

var binarySizeAggVal = binary.Size(bpfobj.ProfiAggVal{})
