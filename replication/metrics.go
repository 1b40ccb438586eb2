package replication

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Replicator's counters and gauges; atomics, so the hot
// paths take no lock for them.
type metrics struct {
	writes, writeFailures, replicaWrites, replicaWriteErrors atomic.Int64
	deletes, served                                          atomic.Int64

	readsLocal, readsRemote, readsMissed, readsCorrupt atomic.Int64
	localCorrupt                                       atomic.Int64

	repairsQueued, repairsDropped, repairsDone, repairErrors atomic.Int64

	hintsStored, hintsRefused, hintsDelivered, hintsDropped atomic.Int64
	hintsPending                                            atomic.Int64

	rebalanceKeys, rebalanceBytes, rebalanceDropped, rebalancePending atomic.Int64
	drainKeys, drainBytes, drainPending                               atomic.Int64

	// receiver budget and serving yield (inbox.go); rebalanceBusy
	// counts push-backs a sender got.
	incomingBusy, incomingWaiting, incomingYields, rebalanceBusy atomic.Int64
	missFallbacks                                                atomic.Int64

	aeRounds, aeBucketsDiffer, aePushed atomic.Int64

	pullRounds, pullKeys, pullBytes, pullRunning atomic.Int64

	keysUnderW, keysUnderR atomic.Int64
}

// Metrics is a snapshot of the Replicator's counters.
type Metrics struct {
	Writes, WriteFailures, ReplicaWrites, ReplicaWriteErrors int64
	Deletes, Served                                          int64
	ReadsLocal, ReadsRemote, ReadsMissed, ReadsCorrupt       int64
	// LocalCorrupt counts this node's own copies found corrupt (by a
	// read here or by a caller's verification) and dropped, so that
	// the key is read from a replica and repaired here.
	LocalCorrupt                                             int64
	RepairsQueued, RepairsDropped, RepairsDone, RepairErrors int64
	HintsStored, HintsRefused, HintsDelivered, HintsDropped  int64
	HintsPending                                             int64
	RebalanceKeys, RebalanceBytes, RebalanceDropped          int64
	RebalancePending                                         int64
	DrainKeys, DrainBytes, DrainPending                      int64
	// IncomingBusy counts rebalance blobs this node refused with ErrBusy
	// (its budget spent), IncomingWaiting the blobs waiting for a slot
	// now, IncomingYields the stores that waited for serving calls first;
	// RebalanceBusy counts refusals this node got as a sender.
	IncomingBusy, IncomingWaiting, IncomingYields, RebalanceBusy int64
	// MissFallbacks counts reads that missed on the replicas and asked
	// the next-ranked members (previous ring unknown, rebalance recent).
	MissFallbacks                               int64
	AntiEntropyRounds, AntiEntropyBucketsDiffer int64
	AntiEntropyPushed                           int64
	// PullRounds, PullKeys and PullBytes count Pull rounds and what they
	// copied here; PullRunning is 1 while StartupPull runs.
	PullRounds, PullKeys, PullBytes, PullRunning int64
	// KeysUnderReplicated and KeysBelowReplicas are the keys the last
	// anti-entropy round found with fewer than W, and fewer than R,
	// copies (AntiEntropyStats.UnderW, UnderR).
	KeysUnderReplicated, KeysBelowReplicas int64
}

// Metrics returns a snapshot of the counters.
func (r *Replicator) Metrics() Metrics {
	m := &r.metrics
	return Metrics{
		Writes: m.writes.Load(), WriteFailures: m.writeFailures.Load(),
		ReplicaWrites: m.replicaWrites.Load(), ReplicaWriteErrors: m.replicaWriteErrors.Load(),
		Deletes: m.deletes.Load(), Served: m.served.Load(),
		ReadsLocal: m.readsLocal.Load(), ReadsRemote: m.readsRemote.Load(),
		ReadsMissed: m.readsMissed.Load(), ReadsCorrupt: m.readsCorrupt.Load(), LocalCorrupt: m.localCorrupt.Load(),
		RepairsQueued: m.repairsQueued.Load(), RepairsDropped: m.repairsDropped.Load(),
		RepairsDone: m.repairsDone.Load(), RepairErrors: m.repairErrors.Load(),
		HintsStored: m.hintsStored.Load(), HintsRefused: m.hintsRefused.Load(),
		HintsDelivered: m.hintsDelivered.Load(), HintsDropped: m.hintsDropped.Load(),
		HintsPending:  m.hintsPending.Load(),
		RebalanceKeys: m.rebalanceKeys.Load(), RebalanceBytes: m.rebalanceBytes.Load(),
		RebalanceDropped: m.rebalanceDropped.Load(), RebalancePending: m.rebalancePending.Load(),
		DrainKeys: m.drainKeys.Load(), DrainBytes: m.drainBytes.Load(), DrainPending: m.drainPending.Load(),
		IncomingBusy: m.incomingBusy.Load(), IncomingWaiting: m.incomingWaiting.Load(),
		IncomingYields: m.incomingYields.Load(), RebalanceBusy: m.rebalanceBusy.Load(),
		MissFallbacks:     m.missFallbacks.Load(),
		AntiEntropyRounds: m.aeRounds.Load(), AntiEntropyBucketsDiffer: m.aeBucketsDiffer.Load(),
		AntiEntropyPushed: m.aePushed.Load(),
		PullRounds:        m.pullRounds.Load(), PullKeys: m.pullKeys.Load(), PullBytes: m.pullBytes.Load(),
		PullRunning:         m.pullRunning.Load(),
		KeysUnderReplicated: m.keysUnderW.Load(), KeysBelowReplicas: m.keysUnderR.Load(),
	}
}

// Collector exports the metrics to Prometheus as kvmesh_replication_*.
func (r *Replicator) Collector() prometheus.Collector { return &collector{r: r} }

type collector struct{ r *Replicator }

type metricDesc struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(Metrics) int64
}

func descs() []metricDesc {
	c := func(name, help string, f func(Metrics) int64) metricDesc {
		return metricDesc{prometheus.NewDesc("kvmesh_replication_"+name, help, nil, nil), prometheus.CounterValue, f}
	}
	g := func(name, help string, f func(Metrics) int64) metricDesc {
		return metricDesc{prometheus.NewDesc("kvmesh_replication_"+name, help, nil, nil), prometheus.GaugeValue, f}
	}
	return []metricDesc{
		c("writes_total", "Writes acknowledged by W replicas.", func(m Metrics) int64 { return m.Writes }),
		c("write_failures_total", "Writes that missed their quorum.", func(m Metrics) int64 { return m.WriteFailures }),
		c("replica_writes_total", "Replica writes that succeeded.", func(m Metrics) int64 { return m.ReplicaWrites }),
		c("replica_write_errors_total", "Replica writes that failed.", func(m Metrics) int64 { return m.ReplicaWriteErrors }),
		c("deletes_total", "Deletes coordinated here.", func(m Metrics) int64 { return m.Deletes }),
		c("served_replicates_total", "Blobs stored for other nodes.", func(m Metrics) int64 { return m.Served }),
		c("reads_local_total", "Reads served from the local store.", func(m Metrics) int64 { return m.ReadsLocal }),
		c("reads_remote_total", "Reads served by another replica.", func(m Metrics) int64 { return m.ReadsRemote }),
		c("reads_missed_total", "Reads no node could serve.", func(m Metrics) int64 { return m.ReadsMissed }),
		c("reads_corrupt_total", "Remote copies that failed verification.", func(m Metrics) int64 { return m.ReadsCorrupt }),
		c("local_corrupt_total", "This node's own copies found corrupt and dropped (read again from a replica and repaired here).", func(m Metrics) int64 { return m.LocalCorrupt }),
		c("repairs_queued_total", "Repairs queued.", func(m Metrics) int64 { return m.RepairsQueued }),
		c("repairs_dropped_total", "Repairs dropped because the queue was full.", func(m Metrics) int64 { return m.RepairsDropped }),
		c("repairs_done_total", "Replicas repaired.", func(m Metrics) int64 { return m.RepairsDone }),
		c("repair_errors_total", "Repairs that failed.", func(m Metrics) int64 { return m.RepairErrors }),
		c("hints_stored_total", "Hints stored for unreachable replicas.", func(m Metrics) int64 { return m.HintsStored }),
		c("hints_refused_total", "Hints not stored (bounds reached).", func(m Metrics) int64 { return m.HintsRefused }),
		c("hints_delivered_total", "Hints delivered.", func(m Metrics) int64 { return m.HintsDelivered }),
		c("hints_dropped_total", "Hints dropped (expired, refused, deleted, target gone).", func(m Metrics) int64 { return m.HintsDropped }),
		g("hints_pending", "Hints held here.", func(m Metrics) int64 { return m.HintsPending }),
		c("rebalance_keys_moved_total", "Keys streamed to new owners.", func(m Metrics) int64 { return m.RebalanceKeys }),
		c("rebalance_bytes_moved_total", "Bytes streamed to new owners.", func(m Metrics) int64 { return m.RebalanceBytes }),
		c("rebalance_keys_dropped_total", "Keys deleted here after their new owners held them.", func(m Metrics) int64 { return m.RebalanceDropped }),
		g("rebalance_pending", "Keys the running rebalance pass still has to move or confirm.", func(m Metrics) int64 { return m.RebalancePending }),
		c("drain_keys_moved_total", "Keys streamed away by Drain.", func(m Metrics) int64 { return m.DrainKeys }),
		c("drain_bytes_moved_total", "Bytes streamed away by Drain.", func(m Metrics) int64 { return m.DrainBytes }),
		g("drain_pending", "Keys the running drain still has to move or confirm.", func(m Metrics) int64 { return m.DrainPending }),
		c("rebalance_incoming_busy_total", "Rebalance blobs refused here because the receiver budget was spent (the sender retries).", func(m Metrics) int64 { return m.IncomingBusy }),
		g("rebalance_incoming_waiting", "Rebalance blobs waiting here for a store slot.", func(m Metrics) int64 { return m.IncomingWaiting }),
		c("rebalance_incoming_yields_total", "Incoming rebalance stores that waited for serving calls to finish.", func(m Metrics) int64 { return m.IncomingYields }),
		c("rebalance_busy_retries_total", "Rebalance blobs this node sent again after a busy receiver pushed back.", func(m Metrics) int64 { return m.RebalanceBusy }),
		c("read_miss_fallbacks_total", "Reads that missed on the replicas and asked the next-ranked members (previous ring unknown).", func(m Metrics) int64 { return m.MissFallbacks }),
		c("antientropy_rounds_total", "Anti-entropy rounds run.", func(m Metrics) int64 { return m.AntiEntropyRounds }),
		c("antientropy_buckets_differ_total", "Digest buckets found different.", func(m Metrics) int64 { return m.AntiEntropyBucketsDiffer }),
		c("antientropy_pushed_total", "Keys copied by anti-entropy.", func(m Metrics) int64 { return m.AntiEntropyPushed }),
		c("pull_rounds_total", "Pull rounds run (a restarted node taking the keys it lacks).", func(m Metrics) int64 { return m.PullRounds }),
		c("pull_keys_total", "Keys copied here by pull rounds.", func(m Metrics) int64 { return m.PullKeys }),
		c("pull_bytes_total", "Bytes copied here by pull rounds.", func(m Metrics) int64 { return m.PullBytes }),
		g("startup_pull_running", "1 while the startup pull runs.", func(m Metrics) int64 { return m.PullRunning }),
		g("keys_under_replicated", "Keys held here with fewer than W copies on their replicas, as the last anti-entropy round found them (counted by the first holder in ring order; a recovering replica counts only what it holds).", func(m Metrics) int64 { return m.KeysUnderReplicated }),
		g("keys_below_replicas", "Keys held here with fewer than R copies on their replicas, as the last anti-entropy round found them (counted by the first holder in ring order).", func(m Metrics) int64 { return m.KeysBelowReplicas }),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs() {
		ch <- d.desc
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.r.Metrics()
	for _, d := range descs() {
		ch <- prometheus.MustNewConstMetric(d.desc, d.typ, float64(d.value(m)))
	}
}
