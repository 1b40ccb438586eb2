package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
)

// lookupOut is one content ID of `kvmesh lookup -format json`.
type lookupOut struct {
	Content string   `json:"content"`
	Result  string   `json:"result"`
	Key     string   `json:"key,omitempty"`
	Holders []string `json:"holders"`
}

func lookupCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("lookup")
	model := fs.String("model", "", "model fingerprint (required)")
	want := fs.String("want", "standalone", "context wanted: standalone, window(W):ID or prefix:ID")
	pos, err := e.parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	fp, err := parseFingerprint(*model)
	if err != nil {
		return usagef("-model: %v", err)
	}
	wc, err := parseContext(*want)
	if err != nil {
		return usagef("-want: %v", err)
	}
	var items []client.LookupItem
	for _, a := range pos {
		id, err := parseID(a)
		if err != nil {
			return usagef("%v", err)
		}
		items = append(items, client.LookupItem{Content: id, Want: wc})
	}
	_, c, err := e.connected(ctx, e.flags("lookup"), nil, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	res, err := c.Lookup(c.ctx, fp, items)
	if err != nil {
		return plain("lookup", err)
	}
	out := []lookupOut{}
	for i, r := range res {
		lo := lookupOut{Content: items[i].Content.String(), Result: strings.ToUpper(r.Match.String()), Holders: []string{}}
		if r.Match != chunk.MatchMiss {
			lo.Key = r.Key.String()
		}
		for _, h := range r.Holders {
			lo.Holders = append(lo.Holders, h.ID)
		}
		out = append(out, lo)
	}
	return e.print(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONTENT\tRESULT\tKEY\tHOLDERS")
		for _, l := range out {
			key := l.Key
			if key == "" {
				key = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Content, l.Result, key, strings.Join(l.Holders, ","))
		}
		return tw.Flush()
	})
}
