package client

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/metadata"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/ring"
)

// Refresh fetches ClusterInfo from a member (or a seed) and adopts its
// ring unless it is older than the one the client has.
func (c *Client) Refresh(ctx context.Context) error {
	var last error = ErrNoNodes
	for _, addr := range c.candidates() {
		cc, err := c.conn(addr)
		if err != nil {
			last = err
			continue
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
		info, err := api.NewClientClient(cc).ClusterInfo(actx, &api.ClusterInfoRequest{})
		cancel()
		if err != nil {
			last = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		c.adopt(info)
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNoNodes, last)
}

func (c *Client) adopt(info *api.ClusterInfoResponse) {
	for {
		old := c.view.Load()
		if old.info.Epoch > info.Epoch || (old.info.Epoch == info.Epoch && len(old.info.Members) > 0 && len(info.Members) == 0) {
			return
		}
		members := make([]ring.Member, len(info.Members))
		for i, m := range info.Members {
			members[i] = api.MemberFromProto(m)
		}
		rf := max(int(info.ReplicationFactor), 1)
		if c.view.CompareAndSwap(old, &view{ring: ring.New(info.Epoch, members), info: info, rf: rf}) {
			return
		}
	}
}

// candidates lists the addresses to ask for cluster info: members first,
// then the seeds.
func (c *Client) candidates() []string {
	seen := make(map[string]bool)
	var out []string
	for _, m := range c.view.Load().ring.Members() {
		if m.GRPCAddr != "" && !seen[m.GRPCAddr] {
			seen[m.GRPCAddr] = true
			out = append(out, m.GRPCAddr)
		}
	}
	for _, s := range c.cfg.Seeds {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// noteEpoch refreshes the ring in the background when a node answered with
// a newer epoch than the client's.
func (c *Client) noteEpoch(md metadata.MD) {
	v := md.Get(api.EpochHeader)
	if len(v) == 0 {
		return
	}
	e, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil || e <= c.view.Load().info.Epoch {
		return
	}
	if !c.refreshing.CompareAndSwap(false, true) {
		return
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer c.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(c.bgCtx, c.cfg.RPCTimeout)
		defer cancel()
		if err := c.Refresh(ctx); err != nil {
			c.log.Debug("client: ring refresh", "err", err)
		}
	}()
}
