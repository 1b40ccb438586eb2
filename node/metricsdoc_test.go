package node_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

var updateMetricsDoc = flag.Bool("update", false, "rewrite docs/METRICS.md from a node's registry")

// metricsDocPath is the metrics reference, relative to this package.
const metricsDocPath = "../docs/METRICS.md"

// docMetric is one metric family as the reference lists it.
type docMetric struct {
	name, typ, help string
	labels          []string
}

// nodeMetrics starts a node, has it serve a little of everything (a
// model, puts raw and lossless, a get, a lookup, refusals) so that every
// metric it registers has a series, and returns its metric families,
// sorted by name. It fails when a metric the node's collectors describe
// has no series: give the workload a call that creates one.
func nodeMetrics(t *testing.T) []docMetric {
	// With a disk tier: some of its metrics exist only for disk.
	n := nodetest.Start(t, 1, nodetest.Config{Node: func(_ int, cfg *node.Config) {
		cfg.DRAMBytes, cfg.DiskBytes, cfg.HTTPAddr, cfg.RPCTimeout = 64<<20, 16<<20, "", 5*time.Second
	}}).Nodes[0]
	testutil.WaitFor(t, "ready", func() bool { return n.Ready() == nil })
	c := newClient(t, n)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	e := testutil.NewEntry(rng, spec, testutil.Tokens(rng, 8), chunk.StandaloneContext())
	if _, err := c.Put(ctx, testutil.Encode(t, e, chunk.CodecRaw)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, e.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, spec.Fingerprint(), []client.LookupItem{{Content: e.Key.Content, Want: e.Key.Context}}); err != nil {
		t.Fatal(err)
	}
	other := spec
	other.Layers++
	_, blob := testutil.StandaloneBlob(t, rng, other, 4)
	if _, err := c.Put(ctx, blob); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("put of an unknown model: %v", err)
	}

	rc := dialRESP(t, nodetest.ServeRESP(t, n))
	do(t, rc, "OK", "SET", "k", "v")
	do(t, rc, "v", "GET", "k")
	do(t, rc, "-ERR unknown command*", "NOPE")

	mfs, err := n.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []docMetric
	have := make(map[string]bool)
	for _, mf := range mfs {
		m := docMetric{name: mf.GetName(), typ: strings.ToLower(mf.GetType().String()), help: mf.GetHelp()}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(m.labels, l.GetName()) {
					m.labels = append(m.labels, l.GetName())
				}
			}
		}
		slices.Sort(m.labels)
		out = append(out, m)
		have[m.name] = true
	}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, d := range n.DescribedMetrics() {
		name := fqName.FindStringSubmatch(d.String())
		if name == nil {
			t.Fatalf("cannot read a metric name from %s", d)
		}
		if !have[name[1]] {
			t.Errorf("metric %s has no series after the workload: add a call that creates one to nodeMetrics", name[1])
		}
	}
	slices.SortFunc(out, func(a, b docMetric) int { return strings.Compare(a.name, b.name) })
	return out
}

// metricsDoc renders the reference.
func metricsDoc(ms []docMetric) string {
	var b strings.Builder
	b.WriteString(`# kvmesh metrics

Every kvmesh node serves these at ` + "`http://HTTP/metrics`" + ` (kvmeshd ` + "`-http`" + `), in the Prometheus
text format. This page is generated from the registry of a node started in process, by ` + "`make docs`" + `
(` + "`go test ./node -run TestMetricsDoc -update`" + `); ` + "`TestMetricsDoc`" + ` fails when the two disagree. Labels
are the ones the node's series carry. The alert rules (` + "`deploy/prometheus/kvmesh-rules.yml`" + `) and the
Grafana dashboard (` + "`deploy/grafana/kvmesh.json`" + `) use them; the README's Observability section says
where logs, audit records, metrics, the dashboard and the rules are.

| metric | type | labels | help |
|---|---|---|---|
`)
	for _, m := range ms {
		help := strings.ReplaceAll(strings.ReplaceAll(m.help, "|", `\|`), "\n", " ")
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.name, m.typ, strings.Join(m.labels, ", "), help)
	}
	return b.String()
}

// deployFiles are the alert rules and the dashboard, relative to this
// package; every metric they name must be one a node registers.
var deployFiles = []string{"../deploy/prometheus/kvmesh-rules.yml", "../deploy/grafana/kvmesh.json"}

// TestMetricsDoc keeps docs/METRICS.md true: it lists every metric a node
// registers, with its type, labels and help. -update rewrites it. It also
// checks that the alert rules and the dashboard name only metrics that
// exist.
func TestMetricsDoc(t *testing.T) {
	ms := nodeMetrics(t)
	t.Run("deploy", func(t *testing.T) { checkDeployMetrics(t, ms) })
	got := metricsDoc(ms)
	if *updateMetricsDoc {
		if err := os.WriteFile(metricsDocPath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(metricsDocPath)
	if err != nil {
		t.Fatalf("%v (make docs writes it)", err)
	}
	if string(want) != got {
		t.Errorf("docs/METRICS.md and the node's registry disagree; run make docs. The registry says:\n%s", got)
	}
}

// checkDeployMetrics fails on a metric name in deployFiles that the node
// does not register. A histogram is named by its series (_bucket, _sum,
// _count); "up" is Prometheus's own.
func checkDeployMetrics(t *testing.T, ms []docMetric) {
	exists := map[string]bool{"up": true}
	for _, m := range ms {
		exists[m.name] = true
		if m.typ == "histogram" || m.typ == "summary" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exists[m.name+s] = true
			}
		}
	}
	names := regexp.MustCompile(`\b(?:kvmesh|kvtier|process|go|promhttp)_[a-z0-9_]+\b`)
	for _, path := range deployFiles {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(path, ".json") && !json.Valid(b) {
			t.Errorf("%s is not valid JSON", path)
		}
		found := names.FindAllString(string(b), -1)
		if len(found) == 0 {
			t.Errorf("%s names no metric", path)
		}
		for _, name := range found {
			if !exists[name] {
				t.Errorf("%s names %s, which no node registers (docs/METRICS.md)", path, name)
			}
		}
	}
}
