package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
)

// ringOut is `kvmesh ring -format json`.
type ringOut struct {
	Epoch             uint64       `json:"epoch"`
	ReplicationFactor int          `json:"replication_factor"`
	Samples           int          `json:"samples"`
	Members           []ringMember `json:"members"`
}

type ringMember struct {
	ID             string  `json:"id"`
	GRPC           string  `json:"grpc"`
	Raft           string  `json:"raft"`
	Gossip         string  `json:"gossip"`
	Weight         float64 `json:"weight"`
	PrimaryPercent float64 `json:"primary_percent"`
	ReplicaPercent float64 `json:"replica_percent"`
	// State and StateReason are as in status: a member whose own ring
	// differs from the leader's at the same epoch is recovering, and the
	// reason says how the rings differ.
	State       string `json:"state"`
	StateReason string `json:"state_reason,omitempty"`
}

func ringCmd(ctx context.Context, e *env, args []string) error {
	_, c, err := e.connected(ctx, e.flags("ring"), args, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := c.ClusterInfo(c.ctx); err != nil {
		return plain("ring", err)
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
	out := ringOut{Epoch: r.Epoch(), ReplicationFactor: rf, Samples: samples, Members: []ringMember{}}
	for _, m := range r.Members() {
		rm := ringMember{ID: m.ID, GRPC: m.GRPCAddr, Raft: m.RaftAddr, Gossip: m.GossipAddr, Weight: m.EffectiveWeight(),
			PrimaryPercent: 100 * float64(primary[m.ID]) / samples, ReplicaPercent: 100 * float64(replica[m.ID]) / samples}
		if _, state, err := c.StatsAndState(c.ctx, m.GRPCAddr); err != nil {
			rm.State, rm.StateReason = stateUnreachable, describe(err)
		} else {
			rm.State, rm.StateReason = api.SplitState(state)
		}
		out.Members = append(out.Members, rm)
	}
	return e.print(out, func(w io.Writer) error { return printRing(w, out) })
}

// printRing is `kvmesh ring`'s text: the table, then why each member that
// is not ready is not.
func printRing(w io.Writer, out ringOut) error {
	fmt.Fprintf(w, "epoch %d, %d members, R=%d\n", out.Epoch, len(out.Members), out.ReplicationFactor)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGRPC\tRAFT\tGOSSIP\tWEIGHT\tPRIMARY\tREPLICA")
	for _, m := range out.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%.1f%%\t%.1f%%\n", m.ID, m.State, m.GRPC, m.Raft, m.Gossip, m.Weight, m.PrimaryPercent, m.ReplicaPercent)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range out.Members {
		if m.StateReason != "" {
			fmt.Fprintf(w, "%s: %s: %s\n", m.ID, m.State, m.StateReason)
		}
	}
	return nil
}
