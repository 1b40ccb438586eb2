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
  kvmesh [-addr A] settings [get]                      the cluster settings (R, W, codec) and their version
  kvmesh [-addr A] settings set [-r R] [-w W] [-codec C] [-if-version V]
                                                       change them through raft (admin); flags not
                                                       given keep their value; 1 <= W <= R <= 16;
                                                       with -if-version, only if they are still at
                                                       version V (as get showed it), else
                                                       FailedPrecondition and nothing changes`

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
		printSettings(stdout, "", resp.Settings, resp.Version)
		return nil
	case "set":
		fs := flag.NewFlagSet("settings set", flag.ContinueOnError)
		fs.SetOutput(stderr)
		r := fs.Uint("r", 0, "replication factor R (0: keep)")
		w := fs.Uint("w", 0, "write quorum W (0: keep)")
		codec := fs.String("codec", "", "codec of new entries: raw, lossless, int8, int4, fp8 (empty: keep)")
		ifVersion := fs.Uint64("if-version", 0, "change only if the settings are still at this version (from settings get)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		conditional := false
		fs.Visit(func(f *flag.Flag) { conditional = conditional || f.Name == "if-version" })
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
		req := &api.SetSettingsRequest{ReplicationFactor: uint32(*r), WriteQuorum: uint32(*w), Codec: *codec}
		if conditional {
			req.ExpectedVersion = ifVersion
		}
		resp, err := ac.SetSettings(ctx, req)
		if err != nil {
			return fmt.Errorf("settings set: %w", err)
		}
		fmt.Fprintf(stdout, "was R=%d W=%d codec=%s\n", resp.Previous.GetReplicationFactor(), resp.Previous.GetWriteQuorum(), resp.Previous.GetCodec())
		printSettings(stdout, "now ", resp.Settings, resp.Version)
		return nil
	}
	return errors.New(settingsUsage)
}

func printSettings(w io.Writer, prefix string, s *api.ClusterSettings, version uint64) {
	fmt.Fprintf(w, "%sR=%d W=%d codec=%s version=%d\n", prefix, s.GetReplicationFactor(), s.GetWriteQuorum(), s.GetCodec(), version)
}
