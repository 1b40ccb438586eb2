package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node/nodetest"
)

// hfTestdata is hfconfig's config.json files (Llama 3.1 8B, Qwen2.5,
// Mistral, Qwen3).
const hfTestdata = "../../hfconfig/testdata/"

// TestRegisterFiles: register tells a config.json from a register JSON,
// maps the config.json with the flags it lacks to the spec docs/KEYS.md
// documents, refuses flags the register JSON names itself, and registers
// with the cluster what it printed.
func TestRegisterFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const llamaFP = "13c6ba2ee1b5da5114ad80eab44adfd3" // docs/KEYS.md's llama spec
	llama := hfTestdata + "llama-3.1-8b-instruct.json"
	rev := []string{"-revision", "meta-llama/Llama-3.1-8B-Instruct@0e9e39f", "-tokenizer", "meta-llama/Llama-3.1-8B-Instruct"}
	out, errOut, code := runCLI(ctx, append([]string{"register", "-dry-run", "-format", "json", llama}, rev...)...)
	var got registerOut
	if code != exitOK || json.Unmarshal([]byte(out), &got) != nil || got.Fingerprint != llamaFP {
		t.Fatalf("dry run: exit %d %+v\n%s%s", code, got, out, errOut)
	}
	// The printed register JSON is itself a register file of the same model.
	dir := t.TempDir()
	specFile := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(specFile, got.Spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, code := runCLI(ctx, "register", "-dry-run", specFile); code != exitOK || !strings.HasPrefix(out, "fingerprint "+llamaFP+"\n") {
		t.Fatalf("register JSON dry run: exit %d\n%s", code, out)
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{llama}, exitUsage, "give -revision"},
		{[]string{specFile, "-dtype", "f16"}, exitUsage, "-dtype applies to a config.json"},
		{[]string{specFile, "-revision", "x"}, exitUsage, "-revision applies to a config.json"},
		{append([]string{llama, "-dtype", "int8"}, rev...), exitUsage, `-dtype "int8"`},
		{append([]string{write("fp8.json", `{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
			"num_attention_heads": 4, "torch_dtype": "float8_e4m3fn"}`)}, rev...), exitError, "give -dtype"},
		{append([]string{write("gemma.json", `{"model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}`)}, rev...),
			exitError, `model_type "gemma"`},
		{append([]string{write("heads.json", `{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
			"num_attention_heads": 4, "num_key_value_heads": 3}`)}, rev...), exitError, "multiple of num_key_value_heads"},
		{[]string{write("other.json", `{"name": "x"}`)}, exitError, "neither a config.json nor a register JSON"},
		{[]string{write("typo.json", `{"family": "llama", "Layers": 2}`)}, exitError, `unknown field "Layers"`},
	} {
		out, errOut, code := runCLI(ctx, append([]string{"register", "-dry-run"}, tc.args...)...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("register %q: exit %d, want %d; output lacks %q?\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
	// Registered for real, the model is listed under the printed fingerprint.
	addr := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0].GRPCAddr()
	qwen := []string{"register", hfTestdata + "qwen2.5-7b-instruct.json", "-revision", "Qwen/Qwen2.5-7B-Instruct@a09a354", "-addr", addr}
	out, errOut, code = runCLI(ctx, qwen...)
	fp := strings.TrimSpace(out)
	if code != exitOK || len(fp) != 32 {
		t.Fatalf("register: exit %d\n%s%s", code, out, errOut)
	}
	dry, _, _ := runCLI(ctx, append(qwen, "-dry-run")...)
	if !strings.HasPrefix(dry, "fingerprint "+fp+"\n") {
		t.Fatalf("dry run says\n%s\nregister said %s", dry, fp)
	}
	out, errOut, code = runCLI(ctx, "models", "-addr", addr)
	if code != exitOK || !strings.Contains(out, fp) || !strings.Contains(out, "Qwen/Qwen2.5-7B-Instruct@a09a354") {
		t.Fatalf("models: exit %d\n%s%s", code, out, errOut)
	}
}
