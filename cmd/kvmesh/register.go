package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/hfconfig"
)

const registerUsage = `Register a model; prints its fingerprint. FILE is either
  - a Hugging Face config.json (it has "model_type"): mapped to a spec by package hfconfig
    (docs/KEYS.md, section 1b). A config.json does not name its weights, so -revision is
    required; -dtype is the dtype of the stored K/V (default: the config's torch_dtype);
  - or a register JSON (it has "family"; docs/KEYS.md, section 1a), which names everything
    itself: -revision, -tokenizer, -dtype and -salt are refused with it.
-dry-run prints the fingerprint and the register JSON without contacting the cluster.`

// registerOut is `kvmesh register -dry-run -format json`.
type registerOut struct {
	Fingerprint string          `json:"fingerprint"`
	Spec        json.RawMessage `json:"spec"`
}

// specFlags are the flags that complete a config.json into a spec.
type specFlags struct{ revision, tokenizer, dtype, salt *string }

func addSpecFlags(fs *flag.FlagSet) specFlags {
	return specFlags{
		revision:  fs.String("revision", "", "config.json only: the weights, e.g. meta-llama/Llama-3.1-8B-Instruct@0e9e39f (required)"),
		tokenizer: fs.String("tokenizer", "", "config.json only: the tokenizer's name (tokenizer_id)"),
		dtype:     fs.String("dtype", "", "config.json only: dtype of the stored K/V: f32, f16 or bf16 (default: the config's torch_dtype)"),
		salt:      fs.String("salt", "", "config.json only: anything else that must give another fingerprint (adapter, tenant)"),
	}
}

// readSpec reads a model spec from a config.json (completed by the flags)
// or a register JSON, told apart by their members.
func (f specFlags) readSpec(path string) (chunk.ModelSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return chunk.ModelSpec{}, err
	}
	if hfconfig.IsConfig(b) {
		spec, err := specFromConfig(b, *f.revision, *f.tokenizer, *f.dtype, *f.salt)
		if err != nil {
			return chunk.ModelSpec{}, fmt.Errorf("%s: %w", path, err)
		}
		return spec, nil
	}
	for _, fl := range []struct{ name, v string }{{"revision", *f.revision}, {"tokenizer", *f.tokenizer}, {"dtype", *f.dtype}, {"salt", *f.salt}} {
		if fl.v != "" {
			return chunk.ModelSpec{}, usagef("-%s applies to a config.json; %s is a register JSON, which names its own", fl.name, path)
		}
	}
	spec, err := chunk.ParseSpecJSON(b)
	if err != nil {
		var probe map[string]json.RawMessage
		if json.Unmarshal(b, &probe) != nil || probe["family"] == nil {
			return chunk.ModelSpec{}, &plainError{msg: fmt.Sprintf("%s is neither a config.json nor a register JSON", path),
				hint: `a config.json has "model_type", a register JSON "family" (docs/KEYS.md, sections 1a and 1b)`, err: err}
		}
		return chunk.ModelSpec{}, fmt.Errorf("%s: %w", path, err)
	}
	return spec, nil
}

func registerCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("register")
	sf := addSpecFlags(fs)
	dry := fs.Bool("dry-run", false, "print the fingerprint and the register JSON; do not register")
	pos, err := e.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	spec, err := sf.readSpec(pos[0])
	if err != nil {
		return err
	}
	if *dry {
		js, err := chunk.MarshalSpecJSON(spec)
		if err != nil {
			return err
		}
		out := registerOut{spec.Fingerprint().String(), js}
		return e.print(out, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "fingerprint %s\n%s\n", out.Fingerprint, js)
			return err
		})
	}
	_, c, err := e.connected(ctx, e.flags("register"), nil, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	fp, err := c.RegisterModel(c.ctx, spec)
	if err != nil {
		return plain("register", err)
	}
	return e.print(map[string]string{"fingerprint": fp.String()}, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, fp)
		return err
	})
}

// specFromConfig maps a config.json to a spec with what it lacks.
func specFromConfig(b []byte, revision, tokenizer, dtype, salt string) (chunk.ModelSpec, error) {
	c, err := hfconfig.Parse(b)
	if err != nil {
		return chunk.ModelSpec{}, err
	}
	if revision == "" {
		return chunk.ModelSpec{}, usagef("register: a config.json does not name its weights: give -revision REPO@COMMIT " +
			"(two fine-tunes of one base share a config.json and must not share a fingerprint)")
	}
	kv := c.DType
	if dtype != "" {
		if kv, err = chunk.ParseDType(dtype); err != nil {
			return chunk.ModelSpec{}, usagef("register: -dtype %q: want f32, f16 or bf16", dtype)
		}
	}
	if kv != chunk.F32 && kv != chunk.F16 && kv != chunk.BF16 {
		return chunk.ModelSpec{}, &plainError{msg: fmt.Sprintf("K/V dtype %v: stored K/V must be f32, f16 or bf16", kv),
			hint: "give -dtype with the dtype the serving engine keeps its KV cache in"}
	}
	spec := c.Spec(kv)
	spec.WeightsRevision, spec.TokenizerID, spec.Salt = revision, tokenizer, salt
	if err := spec.Validate(); err != nil {
		return chunk.ModelSpec{}, err
	}
	return spec, nil
}
