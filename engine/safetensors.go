package engine

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/safetensors"
)

// Tensor is a named tensor widened to float32 (or to be narrowed to DType
// when written).
type Tensor struct {
	DType chunk.DType // dtype on disk
	Shape []int
	Data  []float32
}

// NumElements is the product of the shape.
func (t *Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func stDType(s string) (chunk.DType, error) {
	switch s {
	case "F32":
		return chunk.F32, nil
	case "F16":
		return chunk.F16, nil
	case "BF16":
		return chunk.BF16, nil
	}
	return chunk.DTypeInvalid, fmt.Errorf("%w: safetensors dtype %q (want F32, F16 or BF16)", ErrUnsupported, s)
}

func stName(d chunk.DType) string {
	switch d {
	case chunk.F16:
		return "F16"
	case chunk.BF16:
		return "BF16"
	}
	return "F32"
}

// ParseSafetensors decodes a whole safetensors file held in memory
// (package safetensors). Every tensor is widened to float32; the metadata
// map is returned as well.
func ParseSafetensors(b []byte) (map[string]*Tensor, map[string]string, error) {
	ts, meta, err := safetensors.Parse(b)
	switch {
	case errors.Is(err, safetensors.ErrUnsupported):
		return nil, nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidModel, err)
	}
	out := make(map[string]*Tensor, len(ts))
	for name, st := range ts {
		dt, err := stDType(st.DType)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		t := &Tensor{DType: dt, Shape: st.Shape, Data: make([]float32, st.NumElements())}
		chunk.WidenRow(t.Data, st.Data, dt)
		out[name] = t
	}
	return out, meta, nil
}

// WriteSafetensors writes tensors (narrowed to each one's DType) in name
// order, with the header padded to a multiple of 8 bytes as HF does.
func WriteSafetensors(w io.Writer, tensors map[string]*Tensor, meta map[string]string) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	infos := make([]safetensors.Info, len(names))
	for i, n := range names {
		t := tensors[n]
		if t.NumElements() != len(t.Data) {
			return fmt.Errorf("%w: tensor %q shape %v holds %d values", ErrInvalidModel, n, t.Shape, len(t.Data))
		}
		infos[i] = safetensors.Info{Name: n, DType: stName(t.DType), Shape: t.Shape}
	}
	hdr, err := safetensors.Header(infos, meta)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	bw.Write(hdr)
	var buf []byte
	for _, n := range names {
		t := tensors[n]
		buf = chunk.AppendRow(buf[:0], t.Data, t.DType)
		if _, err := bw.Write(buf); err != nil {
			return fmt.Errorf("engine: write safetensors: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("engine: write safetensors: %w", err)
	}
	return nil
}

// writeSafetensorsFile writes a file atomically enough for tests and demos.
func writeSafetensorsFile(path string, tensors map[string]*Tensor, meta map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if err := WriteSafetensors(f, tensors, meta); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// safetensorsIndex is model.safetensors.index.json.
type safetensorsIndex struct {
	Metadata  map[string]any    `json:"metadata,omitempty"`
	WeightMap map[string]string `json:"weight_map"`
}

// LoadTensors reads the checkpoint in dir: model.safetensors, or the shards
// named by model.safetensors.index.json. Every tensor the index names must be
// in the shard it names.
func LoadTensors(dir string) (map[string]*Tensor, error) {
	idxPath := filepath.Join(dir, "model.safetensors.index.json")
	idxData, err := os.ReadFile(idxPath)
	if os.IsNotExist(err) {
		b, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
		if err != nil {
			return nil, fmt.Errorf("engine: read weights: %w", err)
		}
		ts, _, err := ParseSafetensors(b)
		if err != nil {
			return nil, fmt.Errorf("model.safetensors: %w", err)
		}
		return ts, nil
	}
	if err != nil {
		return nil, fmt.Errorf("engine: read index: %w", err)
	}
	var idx safetensorsIndex
	if err := json.Unmarshal(idxData, &idx); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidModel, idxPath, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%w: %s has an empty weight_map", ErrInvalidModel, idxPath)
	}
	shards := map[string]bool{}
	for _, f := range idx.WeightMap {
		if f != filepath.Base(f) || f == "" || f == "." || f == ".." {
			return nil, fmt.Errorf("%w: shard name %q", ErrInvalidModel, f)
		}
		shards[f] = true
	}
	out := make(map[string]*Tensor, len(idx.WeightMap))
	for f := range shards {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("engine: read shard: %w", err)
		}
		ts, _, err := ParseSafetensors(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for n, t := range ts {
			if idx.WeightMap[n] == f {
				out[n] = t
			}
		}
	}
	for n, f := range idx.WeightMap {
		if out[n] == nil {
			return nil, fmt.Errorf("%w: tensor %q missing from shard %s", ErrInvalidModel, n, f)
		}
	}
	return out, nil
}

// writeSharded splits tensors over n shard files plus the index.
func writeSharded(dir string, tensors map[string]*Tensor, n int) error {
	names := make([]string, 0, len(tensors))
	for k := range tensors {
		names = append(names, k)
	}
	sort.Strings(names)
	idx := safetensorsIndex{WeightMap: map[string]string{}}
	parts := make([]map[string]*Tensor, n)
	var total int
	for i, name := range names {
		s := i * n / len(names)
		if parts[s] == nil {
			parts[s] = map[string]*Tensor{}
		}
		parts[s][name] = tensors[name]
		idx.WeightMap[name] = fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, n)
		total += len(tensors[name].Data) * tensors[name].DType.Size()
	}
	idx.Metadata = map[string]any{"total_size": total}
	for s, p := range parts {
		if p == nil {
			p = map[string]*Tensor{}
		}
		if err := writeSafetensorsFile(filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, n)), p, map[string]string{"format": "pt"}); err != nil {
			return err
		}
	}
	js, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), js, 0o644); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}
