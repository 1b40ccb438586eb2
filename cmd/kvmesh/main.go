// Command kvmesh is the kvmesh command line: cluster status, the ring and
// the models, put/get/lookup/delete of entries from files, a local cluster
// of kvmeshd processes to try things out. The in-process demo is
// cmd/kvmesh-demo.
//
//	kvmesh [-addr HOST:PORT[,...]] status|ring|models
//	kvmesh register SPEC.json
//	kvmesh put ENTRY...
//	kvmesh get [-o FILE] [-layers A:B] [-heads A:B] KEY
//	kvmesh lookup -model FP [-want CONTEXT] CONTENT...
//	kvmesh delete KEY
//	kvmesh drain [-keep] NODE
//	kvmesh token create|list|revoke ...
//	kvmesh gossip-key new|list|install|use|remove ...
//	kvmesh settings [get] | settings set [-r R] [-w W] [-codec C]
//	kvmesh local-cluster [-dir D] [-kvmeshd PATH] N
//
// -addr defaults to $KVMESH_ADDR. Keys print and parse as
// FINGERPRINT/CONTENT/CONTEXT (chunk.Key.String).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/internal/units"
)

const usage = `usage: kvmesh [-addr HOST:PORT[,...]] [-timeout D] [-ca F -cert F -key F] [-token T] COMMAND [ARGS]

commands:
  status                  members, leader, epoch, settings and each node's tiers
  ring                    ring members and their share of a sample of content IDs
  models                  registered models
  register SPEC.json      register a model (chunk.ModelSpec as JSON); prints its fingerprint
  put ENTRY...            store encoded entries (chunk.Encode output) from files
  get [-o FILE] [-layers A:B] [-heads A:B] KEY
                          read an entry (whole, or the decoded K/V of a range)
  lookup -model FP [-want CONTEXT] CONTENT...
                          EXACT / APPROXIMATE / MISS per content ID
  delete KEY              delete an entry from its replicas
  drain [-keep] NODE      copy a node's chunks to their other owners, then the node leaves
                          (NODE: member ID or gRPC address; not bounded by -timeout)
  local-cluster [-dir D] [-kvmeshd PATH] N
                          start N kvmeshd processes on this machine (Ctrl-C stops them)
  certs [-dir D] [-node NAME=HOST,...]... [-client NAME]...
                          make a CA (first run) and node/client certificates (docs/SECURITY.md)
  gossip-key new FILE     write a new gossip keyring file (mode 0600)
  gossip-key list|install KEY|use KEY|remove KEY
                          live key rotation on every member (admin; KEY base64 or @FILE)
  token create [-name N] [-scopes S] [-namespace HEX,...] [-expires D]
                          a new API token from the cluster (admin), printed once
  token list | token revoke ID
                          the cluster's tokens (no secrets); revoke one everywhere (admin)
  settings [get]          the cluster settings: R, W, codec (admin)
  settings set [-r R] [-w W] [-codec C]
                          change them through raft on every node (admin; unset flags keep their value)
  token create -records FILE [...]
                          offline: print a new token; append its record for kvmeshd -tokens-file
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "kvmesh:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvmesh", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	addr := fs.String("addr", os.Getenv("KVMESH_ADDR"), "gRPC address(es) of any cluster member, comma-separated")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of the command")
	var sec secFlags
	sec.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return flag.ErrHelp
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "kvmeshd": // local-cluster runs itself as the daemon when no kvmeshd binary is at hand
		return daemon.Run(ctx, rest, stdout, stderr)
	case "local-cluster":
		return localCluster(ctx, rest, stdout, stderr)
	case "certs":
		return certs(rest, stdout, stderr)
	case "gossip-key", "token", "settings":
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		dial := adminDial(*addr, &sec)
		switch cmd {
		case "token":
			return tokenCmd(ctx, rest, dial, stdout, stderr)
		case "settings":
			return settingsCmd(ctx, rest, dial, stdout, stderr)
		}
		return gossipKeyCmd(ctx, rest, dial, stdout)
	}
	if *addr == "" {
		return errors.New("no cluster address: set -addr or KVMESH_ADDR")
	}
	if cmd == "drain" {
		// -timeout bounds finding the cluster, not the drain.
		nctx, ncancel := context.WithTimeout(ctx, *timeout)
		c, err := client.New(nctx, sec.config(client.Config{Seeds: strings.Split(*addr, ",")}))
		ncancel()
		if err != nil {
			return err
		}
		defer c.Close()
		return drain(ctx, c, rest, stdout, stderr)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c, err := client.New(ctx, sec.config(client.Config{Seeds: strings.Split(*addr, ",")}))
	if err != nil {
		return err
	}
	defer c.Close()
	switch cmd {
	case "status":
		return status(ctx, c, stdout)
	case "ring":
		return showRing(ctx, c, stdout)
	case "models":
		return models(ctx, c, stdout)
	case "register":
		return register(ctx, c, rest, stdout)
	case "put":
		return put(ctx, c, rest, stdout)
	case "get":
		return get(ctx, c, rest, stdout, stderr)
	case "lookup":
		return lookup(ctx, c, rest, stdout, stderr)
	case "delete":
		return del(ctx, c, rest, stdout)
	}
	fs.Usage()
	return fmt.Errorf("unknown command %q", cmd)
}

func status(ctx context.Context, c *client.Client, w io.Writer) error {
	info, err := c.ClusterInfo(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "epoch %d  leader %s (%s)  replication %d  write quorum %d  codec %s\n\n",
		info.Epoch, info.LeaderId, info.LeaderGrpcAddr, info.ReplicationFactor, info.WriteQuorum, info.Codec)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGRPC\tHTTP\tENTRIES\tBYTES\tTIERS")
	for _, m := range info.Members {
		st, err := c.Stats(ctx, m.GrpcAddr)
		if err != nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\tunreachable: %v\n", m.Id, m.GrpcAddr, m.HttpAddr, errors.Unwrap(err))
			continue
		}
		var tiers []string
		for _, t := range st.Tiers {
			tiers = append(tiers, fmt.Sprintf("%s %d entries %s/%s evicted %d", t.Name, t.Entries, units.Bytes(t.Bytes), units.Bytes(t.CapacityBytes), t.Evictions))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", m.Id, m.GrpcAddr, m.HttpAddr, st.Entries, units.Bytes(st.Bytes), strings.Join(tiers, "; "))
	}
	return tw.Flush()
}

func showRing(ctx context.Context, c *client.Client, w io.Writer) error {
	if _, err := c.ClusterInfo(ctx); err != nil {
		return err
	}
	r := c.Ring()
	rf := c.ReplicationFactor()
	const samples = 100000
	primary := make(map[string]int)
	replica := make(map[string]int)
	for i := range samples {
		id := chunk.ID{Lo: uint64(i) * 0x9e3779b97f4a7c15, Hi: uint64(i)}
		for j, m := range r.Replicas(id, rf) {
			if j == 0 {
				primary[m.ID]++
			}
			replica[m.ID]++
		}
	}
	fmt.Fprintf(w, "epoch %d, %d members, R=%d\n", r.Epoch(), r.Len(), rf)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGRPC\tRAFT\tGOSSIP\tWEIGHT\tPRIMARY\tREPLICA")
	for _, m := range r.Members() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.1f%%\t%.1f%%\n", m.ID, m.GRPCAddr, m.RaftAddr, m.GossipAddr, m.EffectiveWeight(),
			100*float64(primary[m.ID])/samples, 100*float64(replica[m.ID])/samples)
	}
	return tw.Flush()
}

func models(ctx context.Context, c *client.Client, w io.Writer) error {
	specs, err := c.Models(ctx)
	if err != nil {
		return err
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Fingerprint().String() < specs[j].Fingerprint().String() })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FINGERPRINT\tFAMILY\tLAYERS\tKV HEADS\tHEAD DIM\tDTYPE\tROPE\tTOKENIZER\tREVISION")
	for _, s := range specs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%v\t%v/%g\t%s\t%s\n", s.Fingerprint(), s.Family, s.Layers, s.KVHeads, s.HeadDim, s.DType,
			s.RopeStyle, s.RopeTheta, s.TokenizerID, s.WeightsRevision)
	}
	return tw.Flush()
}

func register(ctx context.Context, c *client.Client, args []string, w io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: kvmesh register SPEC.json")
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var spec chunk.ModelSpec
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, fp)
	return nil
}

func put(ctx context.Context, c *client.Client, files []string, w io.Writer) error {
	if len(files) == 0 {
		return errors.New("usage: kvmesh put ENTRY...")
	}
	for _, f := range files {
		blob, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		res, err := c.Put(ctx, blob)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		fmt.Fprintf(w, "%s %s stored on %s\n", hd.Key, units.Bytes(uint64(len(blob))), strings.Join(res.StoredOn, ","))
	}
	return nil
}

func get(ctx context.Context, c *client.Client, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output file (default stdout)")
	layers := fs.String("layers", "", "layer range A:B: write the decoded K/V of these layers")
	heads := fs.String("heads", "", "KV head range A:B: write the decoded K/V of these heads")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: kvmesh get [-o FILE] [-layers A:B] [-heads A:B] KEY")
	}
	key, err := parseKey(fs.Arg(0))
	if err != nil {
		return err
	}
	var data []byte
	if *layers == "" && *heads == "" {
		if data, err = c.Get(ctx, key); err != nil {
			return err
		}
	} else {
		var r chunk.Range
		if r.LayerLo, r.LayerHi, err = parseSpan(*layers); err != nil {
			return err
		}
		if r.HeadLo, r.HeadHi, err = parseSpan(*heads); err != nil {
			return err
		}
		res, err := c.GetRange(ctx, key, r)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "layers [%d,%d) heads [%d,%d) of %d tokens, %v, layout [layer][K|V][token][head][dim]\n",
			res.Range.LayerLo, res.Range.LayerHi, res.Range.HeadLo, res.Range.HeadHi, res.Shape.Tokens, res.Shape.DType)
		data = res.Data
	}
	if *out == "" {
		_, err = w.Write(data)
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}

func lookup(ctx context.Context, c *client.Client, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("lookup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "model fingerprint (required)")
	want := fs.String("want", "standalone", "context wanted: standalone, window(W):ID or prefix:ID")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fp, err := parseFingerprint(*model)
	if err != nil {
		return fmt.Errorf("-model: %w", err)
	}
	wc, err := parseContext(*want)
	if err != nil {
		return err
	}
	var items []client.LookupItem
	for _, a := range fs.Args() {
		id, err := parseID(a)
		if err != nil {
			return err
		}
		items = append(items, client.LookupItem{Content: id, Want: wc})
	}
	res, err := c.Lookup(ctx, fp, items)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTENT\tRESULT\tKEY\tHOLDERS")
	for i, r := range res {
		key := "-"
		if r.Match != chunk.MatchMiss {
			key = r.Key.String()
		}
		var holders []string
		for _, h := range r.Holders {
			holders = append(holders, h.ID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", items[i].Content, strings.ToUpper(r.Match.String()), key, strings.Join(holders, ","))
	}
	return tw.Flush()
}

func del(ctx context.Context, c *client.Client, args []string, w io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: kvmesh delete KEY")
	}
	key, err := parseKey(args[0])
	if err != nil {
		return err
	}
	n, err := c.Delete(ctx, key)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "deleted from %d replicas\n", n)
	return nil
}
