package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/units"
)

// drainCmd runs `kvmesh drain [-keep] NODE`: NODE (an ID or a gRPC address of
// a member) copies its chunks to their other owners and leaves the
// cluster, printing progress as it goes. It is not bounded by -timeout:
// moving a node's data takes as long as it takes; Ctrl-C stops waiting
// (and the node stops draining).
// With -format json it prints one JSON object per progress report and a
// last one with "done": true (drainOut).
func drainCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("drain")
	keep := fs.Bool("keep", false, "copy the chunks but stay in the cluster")
	pos, err := e.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	// -timeout bounds finding the cluster, not the drain.
	nctx, ncancel := context.WithTimeout(ctx, e.g.timeout)
	cl, err := e.client(nctx)
	if err != nil {
		ncancel()
		return err
	}
	defer cl.Close()
	addr, id, err := resolveNode(nctx, cl, pos[0])
	ncancel()
	if err != nil {
		return err
	}
	w := e.stdout
	enc := json.NewEncoder(w)
	if !e.json() {
		fmt.Fprintf(w, "draining %s (%s)\n", id, addr)
	}
	last, err := cl.Drain(ctx, addr, *keep, func(p *api.DrainProgress) {
		if e.json() {
			_ = enc.Encode(drainOut{Node: id, Phase: p.Phase, KeysMoved: p.KeysMoved, BytesMoved: p.BytesMoved, Pending: p.Pending})
			return
		}
		fmt.Fprintf(w, "%-9s moved %d keys (%s), %d pending\n", p.Phase, p.KeysMoved, units.Bytes(p.BytesMoved), p.Pending)
	})
	if err != nil {
		return plain("drain "+id, err)
	}
	if e.json() {
		return enc.Encode(drainOut{Node: id, Phase: last.Phase, KeysMoved: last.KeysMoved, BytesMoved: last.BytesMoved, Pending: last.Pending,
			Keys: last.Keys, Done: true, Left: last.Left})
	}
	if last.Left {
		fmt.Fprintf(w, "%s drained (%d keys held, %d copied) and left the cluster; its kvmeshd exits by itself (status 0)\n", id, last.Keys, last.KeysMoved)
	} else {
		fmt.Fprintf(w, "%s drained (%d keys held, %d copied); still a member\n", id, last.Keys, last.KeysMoved)
	}
	return nil
}

// resolveNode maps a member ID or gRPC address to both.
func resolveNode(ctx context.Context, c *client.Client, node string) (addr, id string, err error) {
	info, err := c.ClusterInfo(ctx)
	if err != nil {
		return "", "", plain("drain", err)
	}
	var ids []string
	for _, m := range info.Members {
		if m.Id == node || m.GrpcAddr == node {
			return m.GrpcAddr, m.Id, nil
		}
		ids = append(ids, m.Id)
	}
	return "", "", fmt.Errorf("no member %q (members: %s)", node, strings.Join(ids, ", "))
}

// drainOut is one line of `kvmesh drain -format json`.
type drainOut struct {
	Node       string `json:"node"`
	Phase      string `json:"phase"`
	KeysMoved  uint64 `json:"keys_moved"`
	BytesMoved uint64 `json:"bytes_moved"`
	Pending    uint64 `json:"pending"`
	Keys       uint64 `json:"keys,omitempty"`
	Done       bool   `json:"done,omitempty"`
	Left       bool   `json:"left,omitempty"`
}
