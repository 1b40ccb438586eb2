package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite client/deps.txt from the client's current dependencies")

const depsFile = "client/deps.txt"

// clientForbidden are dependencies the client must never link, whatever
// deps.txt says: the server's consensus, gossip and metrics stacks and
// the server-side packages and the kernels. An application that only looks chunks up
// links none of them.
var clientForbidden = []string{
	"github.com/hashicorp/raft",
	"github.com/hashicorp/memberlist",
	"github.com/hashicorp/go-metrics",
	"github.com/miekg/dns",
	"github.com/prometheus/",
	module + "/node",
	module + "/meta",
	module + "/replication",
	module + "/kvtier",
	module + "/inject",
	module + "/engine",
	module + "/cudakern",
	module + "/gossip",
	module + "/daemon",
}

// TestClientDeps: the client's full dependency list (module packages and
// ours, not the standard library) is the one checked in, and holds none of
// clientForbidden. A new dependency is a decision, reviewed where its
// line is added to client/deps.txt.
func TestClientDeps(t *testing.T) {
	root := moduleRoot(t)
	got, graph := clientDeps(t, root)

	for _, p := range got {
		for _, f := range clientForbidden {
			if p == f || strings.HasPrefix(p, strings.TrimSuffix(f, "/")+"/") {
				t.Errorf("the client links %s (%s), which no client may link (%s in clientForbidden)", p, chain(graph, module+"/client", p), f)
			}
		}
	}

	path := filepath.Join(root, depsFile)
	if *update {
		var b strings.Builder
		b.WriteString("# The client's dependencies: `go list -deps ./client` (linux/amd64, no cgo)\n")
		b.WriteString("# without the standard library. Checked by tests/layering's TestClientDeps;\n")
		b.WriteString("# after an intended change: go test ./tests/layering -run TestClientDeps -update\n")
		for _, p := range got {
			b.WriteString(p + "\n")
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it: go test ./tests/layering -run TestClientDeps -update)", err)
	}
	var want []string
	for line := range strings.Lines(string(data)) {
		if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") {
			want = append(want, s)
		}
	}
	var added, removed []string
	for _, p := range got {
		if !slices.Contains(want, p) {
			added = append(added, p)
		}
	}
	for _, p := range want {
		if !slices.Contains(got, p) {
			removed = append(removed, p)
		}
	}
	if len(added)+len(removed) > 0 {
		var msg strings.Builder
		fmt.Fprintf(&msg, "the client's dependencies differ from %s:\n", depsFile)
		for _, p := range added {
			fmt.Fprintf(&msg, "  new:  %s (%s)\n", p, chain(graph, module+"/client", p))
		}
		for _, p := range removed {
			fmt.Fprintf(&msg, "  gone: %s\n", p)
		}
		msg.WriteString("A new dependency of the client is linked into every application that uses it: avoid it if you can " +
			"(each new line shows the imports that bring it in). If the change is intended, rewrite the file with\n" +
			"  go test ./tests/layering -run TestClientDeps -update\nand commit it with the change.")
		t.Error(msg.String())
	}
}

// clientDeps returns the client's dependencies outside the standard
// library, sorted, and the import graph among them.
func clientDeps(t *testing.T, root string) ([]string, map[string][]string) {
	t.Helper()
	var deps []string
	graph := make(map[string][]string)
	dec := json.NewDecoder(bytes.NewReader(goList(t, root, "-deps", "-json=ImportPath,Imports,Standard", "./client")))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Standard   bool
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Standard {
			continue
		}
		deps = append(deps, p.ImportPath)
		graph[p.ImportPath] = p.Imports
	}
	slices.Sort(deps)
	return deps, graph
}

// chain is a shortest import path from `from` to `to` in graph, written
// "a → b → c", for the message that names an unwanted dependency.
func chain(graph map[string][]string, from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append(path, strings.TrimPrefix(p, module+"/"))
			}
			slices.Reverse(path)
			return strings.Join(path, " → ")
		}
		for _, q := range graph[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return "imported by " + from
}
