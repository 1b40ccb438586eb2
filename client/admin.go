package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
)

// ClusterInfo asks a node for the cluster's members, leader and settings.
func (c *Client) ClusterInfo(ctx context.Context) (*api.ClusterInfoResponse, error) {
	var info *api.ClusterInfoResponse
	err := c.do(ctx, nil, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		info, err = api.NewClientClient(cc).ClusterInfo(ctx, &api.ClusterInfoRequest{})
		return err
	})
	if err == nil {
		c.adopt(info)
	}
	return info, err
}

// RegisterModel registers spec cluster-wide and returns its fingerprint.
func (c *Client) RegisterModel(ctx context.Context, spec chunk.ModelSpec) (chunk.Fingerprint, error) {
	var resp *api.RegisterModelResponse
	err := c.do(ctx, nil, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = api.NewClientClient(cc).RegisterModel(ctx, &api.RegisterModelRequest{Spec: api.ProtoSpec(spec)})
		return err
	})
	if err != nil {
		return chunk.Fingerprint{}, err
	}
	return api.FingerprintFromProto(resp.Fingerprint), nil
}

// Models lists the registered models.
func (c *Client) Models(ctx context.Context) ([]chunk.ModelSpec, error) {
	var resp *api.ModelsResponse
	err := c.do(ctx, nil, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = api.NewClientClient(cc).Models(ctx, &api.ModelsRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]chunk.ModelSpec, 0, len(resp.Models))
	for _, m := range resp.Models {
		spec, err := api.SpecFromProto(m.Spec)
		if err != nil {
			return nil, err
		}
		out = append(out, spec)
	}
	return out, nil
}

// Stats asks the node at addr for its store statistics.
func (c *Client) Stats(ctx context.Context, addr string) (*api.StatsResponse, error) {
	st, _, err := c.StatsAndState(ctx, addr)
	return st, err
}

// StatsAndState is Stats that also returns the node's state: "ready", or
// why it is not (api.StateHeader; empty when the node does not say).
func (c *Client) StatsAndState(ctx context.Context, addr string) (*api.StatsResponse, string, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	var md metadata.MD
	st, err := api.NewClientClient(cc).Stats(ctx, &api.StatsRequest{}, grpc.Header(&md))
	if err != nil {
		return nil, "", err
	}
	var state string
	if v := md.Get(api.StateHeader); len(v) > 0 {
		state = v[0]
	}
	return st, state, nil
}

// Drain asks the node at addr to drain itself (Client.Drain, an admin
// call): copy every chunk it holds to the chunk's other owners and, unless
// keepMembership, leave the cluster. progress, if not nil, gets each
// progress message; Drain returns the last one once the node is done. The
// call runs as long as the drain does, bounded only by ctx.
func (c *Client) Drain(ctx context.Context, addr string, keepMembership bool, progress func(*api.DrainProgress)) (*api.DrainProgress, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	st, err := api.NewClientClient(cc).Drain(ctx, &api.DrainRequest{KeepMembership: keepMembership})
	if err != nil {
		return nil, err
	}
	var last *api.DrainProgress
	for {
		p, err := st.Recv()
		if errors.Is(err, io.EOF) {
			if last == nil || last.Phase != "done" {
				return last, fmt.Errorf("client: drain of %s ended before it was done", addr)
			}
			return last, nil
		}
		if err != nil {
			return last, err
		}
		last = p
		if progress != nil {
			progress(p)
		}
	}
}
