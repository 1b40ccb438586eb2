package node

import "github.com/prometheus/client_golang/prometheus"

// Seams of the refusal, audit and metrics-reference tests in package
// node_test (see export_test.go).

// Registry is the node's Prometheus registry.
func (n *Node) Registry() prometheus.Gatherer { return n.registry }

// DescribedMetrics are the Descs of every metric the node's collectors
// describe.
func (n *Node) DescribedMetrics() []*prometheus.Desc { return n.registry.described() }

// RefusalReason is the reason label of a refused call, "" for none.
var RefusalReason = refusalReason

// AuditArgs are the arguments an audit record keeps.
var AuditArgs = auditArgs
