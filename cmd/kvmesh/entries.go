package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/units"
)

// putOut is one stored entry of `kvmesh put -format json`.
// Checksums are 16 hex digits, as chunk prints them.
type putOut struct {
	File     string   `json:"file"`
	Key      string   `json:"key"`
	Bytes    int      `json:"bytes"`
	StoredOn []string `json:"stored_on"`
	Checksum string   `json:"checksum"`
	// AlreadyStored: the cluster keeps another version of the key, whose
	// checksum is KeptChecksum; this file's bytes were dropped.
	AlreadyStored bool   `json:"already_stored"`
	KeptChecksum  string `json:"kept_checksum"`
}

func putCmd(ctx context.Context, e *env, args []string) error {
	files, c, err := e.connected(ctx, e.flags("put"), args, 1, -1)
	if err != nil {
		return err
	}
	defer c.close()
	var out []putOut
	for _, f := range files {
		blob, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		res, err := c.Put(c.ctx, blob)
		if err != nil {
			return plain("put "+f, err)
		}
		p := putOut{File: f, Key: hd.Key.String(), Bytes: len(blob), StoredOn: res.StoredOn,
			Checksum: fmt.Sprintf("%016x", res.Checksum), AlreadyStored: res.AlreadyStored, KeptChecksum: fmt.Sprintf("%016x", res.Kept)}
		switch {
		case e.json():
		case p.AlreadyStored:
			fmt.Fprintf(e.stdout, "%s %s already stored with checksum %s on %s (this entry, %s, is not kept)\n",
				p.Key, units.Bytes(uint64(p.Bytes)), p.KeptChecksum, strings.Join(p.StoredOn, ","), p.Checksum)
		default:
			fmt.Fprintf(e.stdout, "%s %s stored on %s\n", p.Key, units.Bytes(uint64(p.Bytes)), strings.Join(p.StoredOn, ","))
		}
		out = append(out, p)
	}
	if e.json() {
		return e.print(out, nil)
	}
	return nil
}

func getCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("get")
	out := fs.String("o", "", "output file (default stdout)")
	layers := fs.String("layers", "", "layer range A:B: write the decoded K/V of these layers")
	heads := fs.String("heads", "", "KV head range A:B: write the decoded K/V of these heads")
	pos, c, err := e.connected(ctx, fs, args, 1, 1)
	if err != nil {
		return err
	}
	defer c.close()
	key, err := parseKey(pos[0])
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	var data []byte
	if *layers == "" && *heads == "" {
		if data, err = c.Get(c.ctx, key); err != nil {
			return plain("get "+pos[0], err)
		}
	} else {
		var r chunk.Range
		if r.LayerLo, r.LayerHi, err = parseSpan(*layers); err != nil {
			return &usageError{msg: err.Error()}
		}
		if r.HeadLo, r.HeadHi, err = parseSpan(*heads); err != nil {
			return &usageError{msg: err.Error()}
		}
		res, err := c.GetRange(c.ctx, key, r)
		if err != nil {
			return plain("get "+pos[0], err)
		}
		fmt.Fprintf(e.stderr, "layers [%d,%d) heads [%d,%d) of %d tokens, %v, layout [layer][K|V][token][head][dim]\n",
			res.Range.LayerLo, res.Range.LayerHi, res.Range.HeadLo, res.Range.HeadHi, res.Shape.Tokens, res.Shape.DType)
		data = res.Data
	}
	if *out == "" {
		_, err = e.stdout.Write(data)
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}

func deleteCmd(ctx context.Context, e *env, args []string) error {
	pos, err := e.parse(e.flags("delete"), args, 1, 1)
	if err != nil {
		return err
	}
	key, err := parseKey(pos[0])
	if err != nil {
		return usagef("%v", err)
	}
	_, c, err := e.connected(ctx, e.flags("delete"), nil, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	n, err := c.Delete(c.ctx, key)
	if err != nil {
		return plain("delete", err)
	}
	return e.print(map[string]int{"replicas": n}, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "deleted from %d replicas\n", n)
		return err
	})
}
