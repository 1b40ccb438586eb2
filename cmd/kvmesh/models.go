package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// modelOut is one model of `kvmesh models -format json`.
type modelOut struct {
	Fingerprint string  `json:"fingerprint"`
	Family      string  `json:"family"`
	Layers      int     `json:"layers"`
	KVHeads     int     `json:"kv_heads"`
	HeadDim     int     `json:"head_dim"`
	DType       string  `json:"dtype"`
	Rope        string  `json:"rope"`
	RopeTheta   float64 `json:"rope_theta"`
	Tokenizer   string  `json:"tokenizer"`
	Revision    string  `json:"revision"`
}

func modelsCmd(ctx context.Context, e *env, args []string) error {
	_, c, err := e.connected(ctx, e.flags("models"), args, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	specs, err := c.Models(c.ctx)
	if err != nil {
		return plain("models", err)
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Fingerprint().String() < specs[j].Fingerprint().String() })
	out := []modelOut{}
	for _, s := range specs {
		out = append(out, modelOut{s.Fingerprint().String(), s.Family, int(s.Layers), int(s.KVHeads), int(s.HeadDim), fmt.Sprint(s.DType),
			fmt.Sprint(s.RopeStyle), float64(s.RopeTheta), s.TokenizerID, s.WeightsRevision})
	}
	return e.print(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FINGERPRINT\tFAMILY\tLAYERS\tKV HEADS\tHEAD DIM\tDTYPE\tROPE\tTOKENIZER\tREVISION")
		for _, m := range out {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s/%g\t%s\t%s\n", m.Fingerprint, m.Family, m.Layers, m.KVHeads, m.HeadDim, m.DType,
				m.Rope, m.RopeTheta, m.Tokenizer, m.Revision)
		}
		return tw.Flush()
	})
}
