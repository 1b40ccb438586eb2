package kvtier

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCollector(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 4 * 4096, DiskDir: t.TempDir(), DiskBytes: 1 << 20})
	bs := blobs(t, 6, 12)
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h := mustGet(t, s, bs[0]) // on disk by now: a disk hit, promoted
	defer h.Release()
	if _, err := s.Get(ctx, keyOf(t, makeBlob(t, testFP, 999, 12, testStandalone, 2))); err == nil {
		t.Fatal("hit on a key never put")
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(s.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			got[mf.GetName()+"/"+m.Label[0].GetValue()] = v
		}
	}
	st := s.Stats()
	for _, c := range []struct {
		name string
		want float64
	}{
		{"kvtier_budget_bytes/dram", 4 * 4096},
		{"kvtier_budget_bytes/disk", 1 << 20},
		{"kvtier_entries/dram", float64(st.Tiers[TierDRAM].Entries)},
		{"kvtier_entries/disk", float64(st.Tiers[TierDisk].Entries)},
		{"kvtier_bytes/dram", float64(st.Tiers[TierDRAM].Bytes)},
		{"kvtier_pinned_bytes/dram", float64(len(bs[0]))},
		{"kvtier_hits_total/disk", 1},
		{"kvtier_misses_total/disk", 1},
		{"kvtier_misses_total/dram", 2},
		{"kvtier_promotions_total/dram", 1},
		{"kvtier_demotions_total/dram", float64(st.Tiers[TierDRAM].Demotions)},
		{"kvtier_free_resident_bytes/dram", float64(st.Tiers[TierDRAM].FreeResidentBytes)},
		{"kvtier_released_bytes_total/dram", float64(st.Tiers[TierDRAM].ReleasedBytes)},
	} {
		if v, ok := got[c.name]; !ok || v != c.want {
			t.Errorf("%s = %v (present %v), want %v", c.name, v, ok, c.want)
		}
	}
	if st.Tiers[TierDRAM].Demotions < 2 || st.Entries != len(bs) {
		t.Fatalf("stats: %+v", st)
	}
	if _, ok := got["kvtier_free_resident_bytes/disk"]; ok {
		t.Error("free-resident bytes exported for the disk tier")
	}
	if _, ok := got["kvtier_bytes/gpu"]; ok {
		t.Error("disabled GPU tier exported")
	}
}
