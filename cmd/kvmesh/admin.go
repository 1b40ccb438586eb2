package main

import (
	"context"
	"errors"
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

// adminDialer connects to the Admin API of one node; done closes the
// connection.
type adminDialer func() (ac api.AdminClient, done func(), err error)

// adminDial returns an adminDialer for the first address of addrs with
// the TLS identity and token of sec, dialing as the client library does
// (client.DialOptions: mutual TLS when files are named, the token only
// over TLS unless -insecure, the api codec).
func adminDial(addrs string, sec *secFlags) adminDialer {
	return func() (api.AdminClient, func(), error) {
		addr, _, _ := strings.Cut(addrs, ",")
		if addr == "" {
			return nil, nil, errors.New("no cluster address: set -addr or KVMESH_ADDR")
		}
		opts, err := client.DialOptions(sec.config(client.Config{}))
		if err != nil {
			return nil, nil, err
		}
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			return nil, nil, err
		}
		return api.NewAdminClient(cc), func() { _ = cc.Close() }, nil
	}
}

const gossipKeyUsage = `usage:
  kvmesh gossip-key new FILE                  write a keyring file with one new key (mode 0600)
  kvmesh [-addr A] gossip-key list            every live member's keys (SHA-256 fingerprints)
  kvmesh [-addr A] gossip-key install KEY     rotation step 1 on every live member
  kvmesh [-addr A] gossip-key use KEY         step 2: KEY becomes the primary everywhere
  kvmesh [-addr A] gossip-key remove KEY      step 3: drop the old key everywhere (never the primary)
KEY is base64 (as in keyring files), or @FILE for the first key of a keyring file.`

// gossipKeyCmd is `kvmesh gossip-key new|list|install|use|remove`
// (`kvmesh gossip-key FILE` is `new FILE`): the live rotation steps go to
// Admin.GossipKeys, which applies them on every live member and answers
// per node; the command fails if any node did.
func gossipKeyCmd(ctx context.Context, args []string, dial adminDialer, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(gossipKeyUsage)
	}
	var op api.GossipKeyOp
	switch args[0] {
	case "new":
		if len(args) != 2 {
			return errors.New(gossipKeyUsage)
		}
		return gossipKey(args[1:], stdout)
	case "list":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_LIST
	case "install":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL
	case "use":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_USE
	case "remove":
		op = api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE
	default:
		if len(args) != 1 {
			return errors.New(gossipKeyUsage)
		}
		return gossipKey(args, stdout)
	}
	var key []byte
	if op == api.GossipKeyOp_GOSSIP_KEY_OP_LIST {
		if len(args) != 1 {
			return errors.New(gossipKeyUsage)
		}
	} else {
		if len(args) != 2 {
			return errors.New(gossipKeyUsage)
		}
		var err error
		if key, err = readGossipKey(args[1]); err != nil {
			return fmt.Errorf("gossip-key %s: %w", args[0], err)
		}
	}
	ac, done, err := dial()
	if err != nil {
		return err
	}
	defer done()
	resp, err := ac.GossipKeys(ctx, &api.GossipKeyRequest{Op: op, Key: key})
	if err != nil {
		return fmt.Errorf("gossip-key %s: %w", args[0], err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPRIMARY\tKEYS\tERROR")
	for _, r := range resp.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.NodeId, r.Primary, strings.Join(r.Keys, ","), r.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if resp.Failed > 0 {
		return fmt.Errorf("gossip-key %s failed on %d of %d nodes", args[0], resp.Failed, len(resp.Nodes))
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
