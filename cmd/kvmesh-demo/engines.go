package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// servingEngine is an engine whose paged KV cache lives in shared memory
// registered with a node, which injects chunks straight into it.
type servingEngine struct {
	*engine.Engine
	inj *client.Injector
	shm *inject.ShmCache
}

// newServingEngine loads an engine on weights with the given tokenizer ID
// (part of every chunk key: engines with different IDs share no entries),
// registers its model with the cluster and its cache with local. Close it.
func newServingEngine(ctx context.Context, c *client.Client, local *node.Node, weights *engine.Weights,
	tokenizer string, kvd chunk.DType, cacheTokens int, log *slog.Logger) (*servingEngine, error) {
	se := &servingEngine{}
	e, err := engine.New(weights, engine.Config{CacheTokens: cacheTokens, KVDType: kvd, TokenizerID: tokenizer,
		GPU: linkedGPU(), Logger: log, CacheMemory: func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			var err error
			if se.shm, err = inject.CreateShm("", layers, []pagedkv.CacheLayout{lay}); err != nil {
				return nil, err
			}
			return se.shm.Layers, nil
		}})
	if err != nil {
		se.Close()
		return nil, err
	}
	se.Engine = e
	spec := e.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		se.Close()
		return nil, err
	}
	lay, _ := e.CacheMemory()
	se.inj, err = c.RegisterCache(ctx, local.GRPCAddr(), client.CacheRegistration{Fingerprint: e.Fingerprint(), Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, File: se.shm.Memory.File, Offsets: se.shm.Memory.Offsets})
	if err != nil {
		se.Close()
		return nil, err
	}
	return se, nil
}

// Close unregisters the cache, stops the engine and frees its memory, in
// that order: the node must stop writing before the memory goes.
func (se *servingEngine) Close() error {
	var errs []error
	if se.inj != nil {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, se.inj.Close(uctx))
		cancel()
	}
	if se.Engine != nil {
		se.Engine.Close()
	}
	if se.shm != nil {
		errs = append(errs, se.shm.Close())
	}
	return errors.Join(errs...)
}
