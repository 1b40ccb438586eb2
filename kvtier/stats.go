package kvtier

import "github.com/prometheus/client_golang/prometheus"

// TierStats describes one tier. Counters only grow.
type TierStats struct {
	Tier    Tier
	Enabled bool
	// Budget is the tier's byte budget; Bytes what is charged against it
	// (whole pages in DRAM, file bytes on disk); StoredBytes the entries'
	// own sizes as put.
	Budget      int64
	Bytes       int64
	StoredBytes int64
	Entries     int
	PinnedBytes int64
	Hits        uint64
	Misses      uint64
	// Evictions drop entries for good; Demotions move them to the next
	// tier down; Promotions count entries moved into this tier from below.
	Evictions  uint64
	Demotions  uint64
	Promotions uint64
	// WriteErrors (disk only) counts failed disk writes, NoSpaceErrors
	// those of a file system out of space; Full says the last write
	// failed so. Such a failure lowers Budget to what the tier held.
	WriteErrors   uint64
	NoSpaceErrors uint64
	Full          bool
	// FSBytes and FSFreeBytes (disk only) are the size of the disk tier's
	// file system and its space still free, whatever holds the rest: the
	// tier's budget says nothing of what else fills the disk.
	FSBytes, FSFreeBytes int64
	// Damaged counts stored copies dropped because they failed their
	// checks: disk files at startup (torn writes included) or on read.
	// Only the disk tier has any.
	Damaged uint64
	// FreeResidentBytes (DRAM only) is memory freed by entries that the
	// process still holds: pages not yet returned to the OS, including
	// those a release in flight is returning. It stays below
	// Config.ReleaseBytes between releases. ReleasedBytes counts what
	// releases returned to the OS.
	FreeResidentBytes int64
	ReleasedBytes     uint64
	// LentBytes (DRAM only) is the whole pages of the loans not yet
	// released (Lend), those an entry took included; they count in Bytes
	// and PinnedBytes. AdoptedPuts counts the puts whose entry took a
	// loan's pages instead of a copy.
	LentBytes   int64
	AdoptedPuts uint64
}

// Stats is a snapshot of the Store.
type Stats struct {
	Tiers   [numTiers]TierStats
	Entries int
	// Reuse counts entries, admissions, refusals and evictions by reuse
	// class (how an entry can be reused: ReuseOf).
	Reuse [NumReuse]ReuseStats
}

// Waste is the DRAM tier's page waste: allocated minus stored bytes, as a
// fraction of allocated bytes.
func (st Stats) Waste() float64 {
	d := st.Tiers[TierDRAM]
	if d.Bytes == 0 {
		return 0
	}
	return float64(d.Bytes-d.StoredBytes) / float64(d.Bytes)
}

// Stats returns a snapshot, in O(1): the per-tier counts are kept as
// entries come, move and go (recount). Hits and misses recorded under the
// read lock may land just before or after it.
func (s *Store) Stats() Stats {
	var fsSize, fsFree int64
	if s.disk != nil {
		// A statfs, outside the lock; an error leaves zeros.
		fsSize, fsFree, _ = FSSpace(s.disk.dir)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var st Stats
	for t := range s.tiers {
		tst := &s.tiers[t]
		ts := tst.stats
		ts.Tier = Tier(t)
		ts.Budget = tst.budget
		ts.Bytes = tst.used
		ts.Enabled = ts.Budget > 0 || Tier(t) == TierDisk && s.disk != nil
		if Tier(t) == TierDisk {
			ts.Full = s.diskFull
			ts.FSBytes, ts.FSFreeBytes = fsSize, fsFree
		}
		ts.Hits = tst.hits.Load()
		ts.Misses = tst.misses.Load()
		ts.Entries = tst.entries
		ts.StoredBytes = tst.stored
		// Pinned bytes include detached copies still pinned by handles,
		// which the index no longer reaches; the tiers' used bytes still
		// count them.
		ts.PinnedBytes = s.pinnedBytes[t].Load()
		if Tier(t) == TierDRAM && !s.freed {
			ts.FreeResidentBytes = int64(s.arena.freeResidentPages()) * int64(s.arena.pageSize)
			ts.ReleasedBytes = s.released
			ts.LentBytes = s.lentBytes
			ts.AdoptedPuts = s.adopted
		}
		st.Tiers[t] = ts
		st.Entries += ts.Entries
	}
	st.Reuse = s.reuse
	return st
}

// Collector exposes the Store's Stats as Prometheus metrics, labelled by
// tier, for the node to register.
func (s *Store) Collector() prometheus.Collector { return &collector{s: s} }

type collector struct{ s *Store }

var (
	descBudget     = prometheus.NewDesc("kvtier_budget_bytes", "Byte budget of the tier.", []string{"tier"}, nil)
	descBytes      = prometheus.NewDesc("kvtier_bytes", "Bytes charged to the tier (whole pages in DRAM).", []string{"tier"}, nil)
	descStored     = prometheus.NewDesc("kvtier_stored_bytes", "Bytes of the entries held by the tier, as put.", []string{"tier"}, nil)
	descEntries    = prometheus.NewDesc("kvtier_entries", "Entries held by the tier.", []string{"tier"}, nil)
	descPinned     = prometheus.NewDesc("kvtier_pinned_bytes", "Bytes pinned by open handles.", []string{"tier"}, nil)
	descHits       = prometheus.NewDesc("kvtier_hits_total", "Reads served by the tier.", []string{"tier"}, nil)
	descMisses     = prometheus.NewDesc("kvtier_misses_total", "Reads that did not find the entry in the tier.", []string{"tier"}, nil)
	descEvictions  = prometheus.NewDesc("kvtier_evictions_total", "Entries dropped from the tier for room.", []string{"tier"}, nil)
	descDemotions  = prometheus.NewDesc("kvtier_demotions_total", "Entries moved from the tier to the one below.", []string{"tier"}, nil)
	descPromotions = prometheus.NewDesc("kvtier_promotions_total", "Entries moved into the tier from below.", []string{"tier"}, nil)
	descWriteErrs  = prometheus.NewDesc("kvtier_write_errors_total", "Failed writes to the tier (disk: ENOSPC, I/O errors); the entry stays where it was or is dropped.", []string{"tier"}, nil)
	descNoSpace    = prometheus.NewDesc("kvtier_no_space_errors_total", "Writes to the tier that failed for want of space on its file system (ENOSPC, quota, short write); each lowers the disk budget to what the tier holds.", []string{"tier"}, nil)
	descFull       = prometheus.NewDesc("kvtier_full", "1 while the tier's last write failed for want of space on its file system, else 0.", []string{"tier"}, nil)
	descFSBytes    = prometheus.NewDesc("kvtier_fs_bytes", "Size of the file system the disk tier is on.", []string{"tier"}, nil)
	descFSFree     = prometheus.NewDesc("kvtier_fs_free_bytes", "Free space of the file system the disk tier is on, whatever fills the rest.", []string{"tier"}, nil)
	descDamaged    = prometheus.NewDesc("kvtier_damaged_total", "Stored copies dropped because they failed their checksums or could not be read: disk tier files at startup (torn writes included) and on read; 0 for the other tiers.", []string{"tier"}, nil)
	descFreeRes    = prometheus.NewDesc("kvtier_free_resident_bytes", "Freed DRAM pages the process still holds, not yet returned to the OS.", []string{"tier"}, nil)
	descReleased   = prometheus.NewDesc("kvtier_released_bytes_total", "Freed DRAM pages returned to the OS.", []string{"tier"}, nil)
	descLent       = prometheus.NewDesc("kvtier_lent_bytes", "DRAM pages lent to receive entries into, not yet released.", []string{"tier"}, nil)
	descAdopted    = prometheus.NewDesc("kvtier_adopted_puts_total", "Puts whose entry took the lent pages it was received into, without a copy.", []string{"tier"}, nil)

	descReuseEntries  = prometheus.NewDesc("kvtier_reuse_entries", "Entries held (all tiers) by reuse class: standalone, window, prefix.", []string{"reuse"}, nil)
	descReuseBytes    = prometheus.NewDesc("kvtier_reuse_stored_bytes", "Bytes of the entries held (all tiers, as put) by reuse class.", []string{"reuse"}, nil)
	descAdmitted      = prometheus.NewDesc("kvtier_admitted_total", "New entries stored, by reuse class.", []string{"reuse"}, nil)
	descAdmittedBytes = prometheus.NewDesc("kvtier_admitted_bytes_total", "Bytes of the new entries stored, by reuse class.", []string{"reuse"}, nil)
	descRefused       = prometheus.NewDesc("kvtier_refused_total", "Puts the admission policy turned away (a further prefix-chained copy of a content, its key seen once), by reuse class.", []string{"reuse"}, nil)
	descRefusedBytes  = prometheus.NewDesc("kvtier_refused_bytes_total", "Bytes of the puts the admission policy turned away, by reuse class.", []string{"reuse"}, nil)
	descReuseEvicted  = prometheus.NewDesc("kvtier_reuse_evictions_total", "Entries dropped from the store for room (any tier), by reuse class.", []string{"reuse"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBudget, descBytes, descStored, descEntries, descPinned, descHits, descMisses, descEvictions, descDemotions, descPromotions, descDamaged, descWriteErrs, descNoSpace, descFull, descFSBytes, descFSFree, descFreeRes, descReleased, descLent, descAdopted,
		descReuseEntries, descReuseBytes, descAdmitted, descAdmittedBytes, descRefused, descRefusedBytes, descReuseEvicted} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for _, t := range st.Tiers {
		if !t.Enabled {
			continue
		}
		l := t.Tier.String()
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l)
		}
		n := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l)
		}
		g(descBudget, float64(t.Budget))
		g(descBytes, float64(t.Bytes))
		g(descStored, float64(t.StoredBytes))
		g(descEntries, float64(t.Entries))
		g(descPinned, float64(t.PinnedBytes))
		n(descHits, t.Hits)
		n(descMisses, t.Misses)
		n(descEvictions, t.Evictions)
		n(descDemotions, t.Demotions)
		n(descPromotions, t.Promotions)
		n(descDamaged, t.Damaged)
		if t.Tier == TierDisk {
			n(descWriteErrs, t.WriteErrors)
			n(descNoSpace, t.NoSpaceErrors)
			full := 0.0
			if t.Full {
				full = 1
			}
			g(descFull, full)
			g(descFSBytes, float64(t.FSBytes))
			g(descFSFree, float64(t.FSFreeBytes))
		}
		if t.Tier == TierDRAM {
			g(descFreeRes, float64(t.FreeResidentBytes))
			n(descReleased, t.ReleasedBytes)
			g(descLent, float64(t.LentBytes))
			n(descAdopted, t.AdoptedPuts)
		}
	}
	for _, r := range st.Reuse {
		l := r.Reuse.String()
		ch <- prometheus.MustNewConstMetric(descReuseEntries, prometheus.GaugeValue, float64(r.Entries), l)
		ch <- prometheus.MustNewConstMetric(descReuseBytes, prometheus.GaugeValue, float64(r.StoredBytes), l)
		ch <- prometheus.MustNewConstMetric(descAdmitted, prometheus.CounterValue, float64(r.Admitted), l)
		ch <- prometheus.MustNewConstMetric(descAdmittedBytes, prometheus.CounterValue, float64(r.AdmittedBytes), l)
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(r.Refused), l)
		ch <- prometheus.MustNewConstMetric(descRefusedBytes, prometheus.CounterValue, float64(r.RefusedBytes), l)
		ch <- prometheus.MustNewConstMetric(descReuseEvicted, prometheus.CounterValue, float64(r.Evicted), l)
	}
}
