package inject

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/chunk"
)

// metrics are the Service's Prometheus metrics; the Service is their
// Collector.
type metrics struct {
	requests prometheus.Counter
	chunks   *prometheus.CounterVec // result: exact, approximate, miss
	decoded  prometheus.Counter
	written  prometheus.Counter
	layer    prometheus.Histogram
	request  prometheus.Histogram
	caches   prometheus.Gauge
	faults   prometheus.Counter
	// deviceChunks counts hits written from device copies (no host copy).
	deviceChunks prometheus.Counter
	// arrivalFailures counts hits lost because a layer of their entry
	// never arrived (the replica's stream failed).
	arrivalFailures prometheus.Counter
	// stages: per request, the time spent in each stage (Timings).
	stages   *prometheus.HistogramVec
	stageObs [len(stageNames)]prometheus.Observer
}

func newMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_requests_total", Help: "Inject requests served.",
		}),
		chunks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_inject_chunks_total", Help: "Chunks of inject requests, by result (exact, approximate, miss).",
		}, []string{"result"}),
		decoded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_decoded_bytes_total", Help: "Canonical KV bytes decoded from entries for injection.",
		}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_written_bytes_total", Help: "KV bytes written into registered caches.",
		}),
		layer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvmesh_inject_layer_seconds",
			Help:    "Pipeline latency of one layer: from the start of its decode to the last of its chunks written.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
		}),
		request: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_inject_request_seconds", Help: "Inject request latency, fetch included.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		}),
		caches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_inject_registered_caches", Help: "KV caches registered for injection.",
		}),
		faults: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_faults_total", Help: "Inject requests stopped by a fault in registered memory.",
		}),
		deviceChunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_device_chunks_total",
			Help: "Chunks written into a cache in device memory straight from the node's GPU tier, read there by the kernel (no copy through the host).",
		}),
		arrivalFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_arrival_failures_total",
			Help: "Chunks streamed from a replica that became a miss because a layer did not arrive (their earlier layers were written).",
		}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvmesh_inject_stage_seconds",
			Help:    "Time an inject request spent in a stage (fetch, arrive, verify, decode, scatter), summed over its chunks and layers; observed for each request that spent time in it.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
		}, []string{"stage"}),
	}
	for i, st := range stageNames {
		m.stageObs[i] = m.stages.WithLabelValues(st)
	}
	// Every result has a series from the start, so rates and alerts see
	// zeros rather than nothing.
	for _, r := range []chunk.Match{chunk.MatchExact, chunk.MatchApproximate, chunk.MatchMiss} {
		m.chunks.WithLabelValues(r.String())
	}
	return m
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.chunks, m.decoded, m.written, m.layer, m.request, m.caches, m.faults, m.deviceChunks, m.arrivalFailures, m.stages}
}

// stageNames label kvmesh_inject_stage_seconds, in Timings' order.
var stageNames = [...]string{"fetch", "arrive", "verify", "decode", "scatter"}

// observeStages records the stages t spent time in.
func (m *metrics) observeStages(t *Timings) {
	for i, d := range [...]time.Duration{t.Fetch, t.Arrive, t.Verify, t.Decode, t.Scatter} {
		if d > 0 {
			m.stageObs[i].Observe(d.Seconds())
		}
	}
}

// StageTotals is the time every request so far spent in each stage:
// kvmesh_inject_stage_seconds' sums, for a caller that reports the split
// of a run from the difference of two readings.
func (s *Service) StageTotals() Timings {
	var d [len(stageNames)]time.Duration
	for i, o := range s.m.stageObs {
		var m dto.Metric
		if h, ok := o.(prometheus.Metric); ok && h.Write(&m) == nil {
			d[i] = time.Duration(m.GetHistogram().GetSampleSum() * float64(time.Second))
		}
	}
	return Timings{Fetch: d[0], Arrive: d[1], Verify: d[2], Decode: d[3], Scatter: d[4]}
}

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.m.all() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s.m.all() {
		c.Collect(ch)
	}
}
