package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

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

// settingsOut is `kvmesh settings get|set -format json`; set adds the
// previous settings.
type settingsOut struct {
	ReplicationFactor uint32       `json:"replication_factor"`
	WriteQuorum       uint32       `json:"write_quorum"`
	Codec             string       `json:"codec"`
	Version           uint64       `json:"version"`
	Previous          *settingsOut `json:"previous,omitempty"`
}

func toSettingsOut(s *api.ClusterSettings, version uint64) settingsOut {
	return settingsOut{s.GetReplicationFactor(), s.GetWriteQuorum(), s.GetCodec(), version, nil}
}

// settingsCmd is `kvmesh settings [get]` and `kvmesh settings set`: the
// cluster settings over Admin.GetSettings and Admin.SetSettings.
func settingsCmd(ctx context.Context, e *env, args []string) error {
	sub := "get"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "get":
		if _, err := e.parse(e.flags("settings get"), args, 0, 0); err != nil {
			return err
		}
		a, err := e.admin(ctx)
		if err != nil {
			return err
		}
		defer a.close()
		resp, err := a.GetSettings(a.ctx, &api.GetSettingsRequest{})
		if err != nil {
			return plain("settings get", err)
		}
		out := toSettingsOut(resp.Settings, resp.Version)
		return e.print(out, func(w io.Writer) error {
			printSettings(w, "", out)
			return nil
		})
	case "set":
		fs := e.flags("settings set")
		r := fs.Uint("r", 0, "replication factor R (0: keep)")
		w := fs.Uint("w", 0, "write quorum W (0: keep)")
		codec := fs.String("codec", "", "codec of new entries: raw, lossless, int8, int4, fp8 (empty: keep)")
		ifVersion := fs.Uint64("if-version", 0, "change only if the settings are still at this version (from settings get)")
		if _, err := e.parse(fs, args, 0, 0); err != nil {
			return err
		}
		conditional := false
		fs.Visit(func(f *flag.Flag) { conditional = conditional || f.Name == "if-version" })
		if *r == 0 && *w == 0 && *codec == "" {
			return usagef("settings set: nothing to change (give -r, -w or -codec)")
		}
		if *r > 1<<16 || *w > 1<<16 {
			return usagef("settings set: R %d or W %d out of range", *r, *w)
		}
		a, err := e.admin(ctx)
		if err != nil {
			return err
		}
		defer a.close()
		if err := a.requireLeader(); err != nil {
			return err
		}
		req := &api.SetSettingsRequest{ReplicationFactor: uint32(*r), WriteQuorum: uint32(*w), Codec: *codec}
		if conditional {
			req.ExpectedVersion = ifVersion
		}
		resp, err := a.SetSettings(a.ctx, req)
		if err != nil {
			return plain("settings set", err)
		}
		out := toSettingsOut(resp.Settings, resp.Version)
		prev := toSettingsOut(resp.Previous, 0)
		out.Previous = &prev
		return e.print(out, func(w io.Writer) error {
			fmt.Fprintf(w, "was R=%d W=%d codec=%s\n", prev.ReplicationFactor, prev.WriteQuorum, prev.Codec)
			printSettings(w, "now ", out)
			return nil
		})
	case "-h", "-help", "--help":
		printHelp(e.stdout, "settings", nil)
		return flag.ErrHelp
	}
	return usagef("settings: unknown subcommand %q (get or set)", sub)
}

func printSettings(w io.Writer, prefix string, s settingsOut) {
	fmt.Fprintf(w, "%sR=%d W=%d codec=%s version=%d\n", prefix, s.ReplicationFactor, s.WriteQuorum, s.Codec, s.Version)
}
