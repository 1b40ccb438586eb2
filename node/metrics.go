package node

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/respserver"
)

// metrics are the node's own Prometheus metrics; the store and the
// metadata register their own collectors next to them.
type metrics struct {
	requests *prometheus.CounterVec   // method, code
	latency  *prometheus.HistogramVec // method
	panics   prometheus.Counter
	bytesIn  *prometheus.CounterVec // op
	bytesOut *prometheus.CounterVec // op
	lookups  *prometheus.CounterVec // result
	forwards prometheus.Counter
	// transcoded counts client puts stored in another codec than they
	// came in, by the codec stored.
	transcoded *prometheus.CounterVec
	// refused counts requests refused (refusalReason), by method and
	// reason.
	refused *prometheus.CounterVec
	// resp are the Redis-protocol door's (RESPConfig), registered
	// whether or not the node serves it.
	resp *respserver.Metrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_rpc_requests_total", Help: "gRPC requests served, by method and status code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvmesh_rpc_duration_seconds", Help: "gRPC request latency, by method.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		}, []string{"method"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_rpc_panics_total", Help: "Panics recovered in gRPC handlers.",
		}),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_bytes_received_total", Help: "Tensor entry bytes received, by operation.",
		}, []string{"op"}),
		bytesOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_bytes_sent_total", Help: "Tensor entry bytes sent, by operation.",
		}, []string{"op"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_lookup_results_total", Help: "Lookup answers, by result (exact, approximate, miss).",
		}, []string{"result"}),
		forwards: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_forwarded_puts_total", Help: "Puts this node coordinated without being a replica.",
		}),
		transcoded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_transcoded_puts_total", Help: "Client puts stored in the cluster codec rather than the one they came in, by the codec stored.",
		}, []string{"codec"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_requests_refused_total",
			Help: "gRPC requests refused, by method and reason (unauthenticated, permission_denied, invalid_argument, out_of_range, resource_exhausted, failed_precondition, unavailable, malformed: a request gRPC could not decode); the Guard's refusals are counted here and not in kvmesh_rpc_requests_total.",
		}, []string{"method", "reason"}),
	}
	reg.MustRegister(m.requests, m.latency, m.panics, m.bytesIn, m.bytesOut, m.lookups, m.forwards, m.transcoded, m.refused,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	var err error
	if m.resp, err = respserver.NewMetrics(reg); err != nil {
		panic(err)
	}
	return m
}

// registry is the node's Prometheus registry. It remembers the collectors
// registered on it, so that the metrics reference (docs/METRICS.md, kept
// by TestMetricsDoc) can tell every metric the node describes, series or
// not.
type registry struct {
	*prometheus.Registry
	mu         sync.Mutex
	collectors []prometheus.Collector
}

func (r *registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.collectors = append(r.collectors, c)
	r.mu.Unlock()
	return nil
}

func (r *registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// described returns the Desc of every metric the registered collectors
// describe (an unchecked collector describes none).
func (r *registry) described() []*prometheus.Desc {
	r.mu.Lock()
	cs := slices.Clone(r.collectors)
	r.mu.Unlock()
	ch := make(chan *prometheus.Desc)
	go func() {
		defer close(ch)
		for _, c := range cs {
			c.Describe(ch)
		}
	}()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// metaCollector exposes meta.Store's gauges, read at scrape time.
type metaCollector struct{ n *Node }

func (c metaCollector) Describe(ch chan<- *prometheus.Desc) {
	// Unchecked collector: the set of gauges depends on what raft can
	// report at scrape time.
}

func (c metaCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.n.meta.Metrics() {
		d := prometheus.NewDesc(g.Name, g.Help, nil, nil)
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, g.Value)
	}
}

func (n *Node) registerMetaMetrics() {
	if err := n.registry.Register(metaCollector{n}); err != nil {
		n.log.Warn("node: register metadata metrics", "err", err)
	}
}

// readCounter reads a counter's current value (for the Stats RPC).
func readCounter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
