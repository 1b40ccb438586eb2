package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
)

// adminConn is a connection to the Admin API of the first node of -addr
// that answers, with the command's deadline.
type adminConn struct {
	api.AdminClient
	cc     *grpc.ClientConn
	ctx    context.Context
	cancel context.CancelFunc
}

func (a *adminConn) close() {
	_ = a.cc.Close()
	a.cancel()
}

// admin connects to the Admin API as the client library dials
// (client.DialOptions: mutual TLS when files are named, the token only
// over TLS unless -insecure, the api codec).
func (e *env) admin(ctx context.Context) (*adminConn, error) {
	seeds, err := e.seeds()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, e.g.timeout)
	addr, err := e.firstAnswering(cctx, seeds)
	if err != nil {
		cancel()
		return nil, err
	}
	opts, err := client.DialOptions(e.g.sec.config(client.Config{}))
	if err != nil {
		cancel()
		return nil, err
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &adminConn{AdminClient: api.NewAdminClient(cc), cc: cc, ctx: cctx, cancel: cancel}, nil
}

// requireLeader fails fast when the node knows no leader: an admin write
// would otherwise wait for one until -timeout.
func (a *adminConn) requireLeader() error {
	info, err := api.NewClientClient(a.cc).ClusterInfo(a.ctx, &api.ClusterInfoRequest{})
	if err != nil {
		return plain("cluster info", err)
	}
	if info.LeaderId == "" {
		return errNoLeader
	}
	return nil
}

const gossipKeyUsage = `usage:
  kvmesh gossip-key new FILE                  write a keyring file with one new key (mode 0600)
  kvmesh [-addr A] gossip-key list            every live member's keys (SHA-256 fingerprints)
  kvmesh [-addr A] gossip-key install KEY     rotation step 1 on every live member
  kvmesh [-addr A] gossip-key use KEY         step 2: KEY becomes the primary everywhere
  kvmesh [-addr A] gossip-key remove KEY      step 3: drop the old key everywhere (never the primary)
KEY is base64 (as in keyring files), or @FILE for the first key of a keyring file.`

// gossipKeyOut is one node's answer in `kvmesh gossip-key ... -format json`.
type gossipKeyOut struct {
	Node    string   `json:"node"`
	Primary string   `json:"primary"`
	Keys    []string `json:"keys"`
	Error   string   `json:"error,omitempty"`
}

// gossipKeyCmd is `kvmesh gossip-key new|list|install|use|remove`: the
// live rotation steps go to Admin.GossipKeys, which applies them on every
// live member and answers per node; the command fails if any node did.
func gossipKeyCmd(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("gossip-key: missing subcommand (new, list, install, use or remove)")
	}
	sub := args[0]
	var op api.GossipKeyOp
	switch sub {
	case "new":
		pos, err := e.parse(e.flags("gossip-key new"), args[1:], 1, 1)
		if err != nil {
			return err
		}
		return gossipKeyNew(e, pos[0])
	case "list":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_LIST
	case "install":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL
	case "use":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_USE
	case "remove":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE
	case "-h", "-help", "--help":
		printHelp(e.stdout, "gossip-key", nil)
		return flag.ErrHelp
	default:
		return usagef("gossip-key: unknown subcommand %q (new, list, install, use or remove)", sub)
	}
	nargs := 1
	if op == api.GossipKeyOp_GOSSIP_KEY_OP_LIST {
		nargs = 0
	}
	pos, err := e.parse(e.flags("gossip-key "+sub), args[1:], nargs, nargs)
	if err != nil {
		return err
	}
	var key []byte
	if nargs == 1 {
		if key, err = readGossipKey(pos[0]); err != nil {
			return fmt.Errorf("gossip-key %s: %w", sub, err)
		}
	}
	a, err := e.admin(ctx)
	if err != nil {
		return err
	}
	defer a.close()
	if op != api.GossipKeyOp_GOSSIP_KEY_OP_LIST {
		if err := a.requireLeader(); err != nil {
			return err
		}
	}
	resp, err := a.GossipKeys(a.ctx, &api.GossipKeyRequest{Op: op, Key: key})
	if err != nil {
		return plain("gossip-key "+sub, err)
	}
	out := []gossipKeyOut{}
	for _, r := range resp.Nodes {
		keys := r.Keys
		if keys == nil {
			keys = []string{}
		}
		out = append(out, gossipKeyOut{r.NodeId, r.Primary, keys, r.Error})
	}
	if err := e.print(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tPRIMARY\tKEYS\tERROR")
		for _, r := range out {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Node, r.Primary, strings.Join(r.Keys, ","), r.Error)
		}
		return tw.Flush()
	}); err != nil {
		return err
	}
	if resp.Failed > 0 {
		return fmt.Errorf("gossip-key %s failed on %d of %d nodes", sub, resp.Failed, len(resp.Nodes))
	}
	return nil
}

// readGossipKey parses a base64 key, or @FILE's first key.
func readGossipKey(arg string) ([]byte, error) {
	path, ok := strings.CutPrefix(arg, "@")
	if !ok {
		return gossipkey.Parse(arg)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	primary, _, err := gossipkey.ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return primary, nil
}
