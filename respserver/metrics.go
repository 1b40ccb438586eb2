package respserver

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the door's Prometheus series.
type Metrics struct {
	commands    *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	connections prometheus.Gauge
	accepted    prometheus.Counter
	bytes       *prometheus.CounterVec
}

// NewMetrics registers the door's series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_resp_commands_total",
			Help: "Commands of the Redis-protocol door by command and result (ok, nil for a missing key, error)."}, []string{"command", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvmesh_resp_command_seconds",
			Help:    "Time the Redis-protocol door took to run a command, its arguments read, by command.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"command"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_resp_connections",
			Help: "Open connections of the Redis-protocol door."}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_resp_connections_total",
			Help: "Connections the Redis-protocol door accepted (refused ones included)."}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_resp_value_bytes_total",
			Help: "Value bytes through the Redis-protocol door: in (SET, SETNX, MSET) and out (GET, MGET)."}, []string{"direction"}),
	}
	for _, c := range []prometheus.Collector{m.commands, m.seconds, m.connections, m.accepted, m.bytes} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("respserver: metrics"), err)
		}
	}
	return m, nil
}
