package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/kvmesh/kvmesh/api"
)

const settingsUsage = `usage:
  kvmesh [-addr A] settings [get]                      the cluster settings (R, W, codec)
  kvmesh [-addr A] settings set [-r R] [-w W] [-codec C]
                                                       change them through raft (admin); flags not
                                                       given keep their value; 1 <= W <= R <= 16`

// settingsCmd is `kvmesh settings [get]` and `kvmesh settings set`: the
// cluster settings over Admin.GetSettings and Admin.SetSettings.
func settingsCmd(ctx context.Context, args []string, dial adminDialer, stdout, stderr io.Writer) error {
	sub := "get"
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "get":
		if len(args) != 0 {
			return errors.New(settingsUsage)
		}
		ac, done, err := dial()
		if err != nil {
			return err
		}
		defer done()
		resp, err := ac.GetSettings(ctx, &api.GetSettingsRequest{})
		if err != nil {
			return fmt.Errorf("settings get: %w", err)
		}
		printSettings(stdout, "", resp.Settings)
		return nil
	case "set":
		fs := flag.NewFlagSet("settings set", flag.ContinueOnError)
		fs.SetOutput(stderr)
		r := fs.Uint("r", 0, "replication factor R (0: keep)")
		w := fs.Uint("w", 0, "write quorum W (0: keep)")
		codec := fs.String("codec", "", "codec of new entries: raw, lossless, int8, int4, fp8 (empty: keep)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() != 0 {
			return errors.New(settingsUsage)
		}
		if *r == 0 && *w == 0 && *codec == "" {
			return fmt.Errorf("settings set: nothing to change\n%s", settingsUsage)
		}
		if *r > 1<<16 || *w > 1<<16 {
			return fmt.Errorf("settings set: R %d or W %d out of range", *r, *w)
		}
		ac, done, err := dial()
		if err != nil {
			return err
		}
		defer done()
		resp, err := ac.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: uint32(*r), WriteQuorum: uint32(*w), Codec: *codec})
		if err != nil {
			return fmt.Errorf("settings set: %w", err)
		}
		printSettings(stdout, "was ", resp.Previous)
		printSettings(stdout, "now ", resp.Settings)
		return nil
	}
	return errors.New(settingsUsage)
}

func printSettings(w io.Writer, prefix string, s *api.ClusterSettings) {
	fmt.Fprintf(w, "%sR=%d W=%d codec=%s\n", prefix, s.GetReplicationFactor(), s.GetWriteQuorum(), s.GetCodec())
}
