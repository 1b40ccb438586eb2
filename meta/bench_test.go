package meta

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
)

// BenchmarkRegisterModel measures a committed write: on a single-node
// leader (one fsync per batch) and forwarded from a follower of a 3-node
// cluster over real TCP; -cpu sets the writers' parallelism.
func BenchmarkRegisterModel(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			c := newCluster(b, n)
			for _, id := range ids(n) {
				c.start(id)
			}
			c.waitAgree(ids(n))
			s := c.leader()
			if n > 1 {
				s = c.follower()
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					spec := testSpec(0)
					spec.Salt = fmt.Sprint(seq.Add(1))
					if _, err := s.RegisterModel(ctxT(b), spec); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkModelLookup is the read every Put and Get does.
func BenchmarkModelLookup(b *testing.B) {
	cfg := fastConfig("r", b.TempDir())
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(b), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitLeader(ctxT(b)); err != nil {
		b.Fatal(err)
	}
	var fps []chunk.Fingerprint
	for i := range 16 {
		fp, err := s.RegisterModel(ctxT(b), testSpec(i))
		if err != nil {
			b.Fatal(err)
		}
		fps = append(fps, fp)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := s.Model(fps[i%len(fps)]); !ok {
				b.Error("model missing")
				return
			}
			_ = s.Ring()
			i++
		}
	})
}

// BenchmarkLookupToken is the read every authenticated request does: the
// Store's LookupToken alone, and behind an auth.Verifier (which adds the
// HMAC of the secret).
func BenchmarkLookupToken(b *testing.B) {
	cfg := fastConfig("t", b.TempDir())
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(b), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitLeader(ctxT(b)); err != nil {
		b.Fatal(err)
	}
	var toks []auth.Token
	for i := range 64 {
		tok, rec := newRecord(b, fmt.Sprint("t", i), auth.ScopeRead, "a1b2")
		if err := s.PutToken(ctxT(b), rec); err != nil {
			b.Fatal(err)
		}
		toks = append(toks, tok)
	}
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := b.Context()
			i := 0
			for pb.Next() {
				if _, err := s.LookupToken(ctx, toks[i%len(toks)].ID); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
	b.Run("verifier", func(b *testing.B) {
		v := auth.NewVerifier(s)
		presented := make([]string, len(toks))
		for i, t := range toks {
			presented[i] = t.String()
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := b.Context()
			i := 0
			for pb.Next() {
				if _, err := v.Verify(ctx, presented[i%len(presented)]); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}

// BenchmarkLogStore measures the raft log store on its own: raft-wal as
// it is (raw) and with the entry checksums raft uses (checked), a store
// of one entry (one fsync) and a read, each entry the size of a model
// registration.
func BenchmarkLogStore(b *testing.B) {
	data := make([]byte, 400)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for _, mode := range []string{"raw", "checked"} {
		b.Run(mode, func(b *testing.B) {
			dir := b.TempDir()
			md := &metadb.BoltMetaDB{}
			w, err := raftwal.Open(dir, raftwal.WithMetaStore(md))
			if err != nil {
				b.Fatal(err)
			}
			defer md.Close()
			defer w.Close()
			var ls raft.LogStore = w
			if mode == "checked" {
				if ls, err = newCheckedLog(w, w); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("store", func(b *testing.B) {
				first, _ := ls.LastIndex()
				b.ReportAllocs()
				for i := range b.N {
					l := &raft.Log{Index: first + uint64(i) + 1, Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
					if err := ls.StoreLogs([]*raft.Log{l}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("get", func(b *testing.B) {
				last, _ := ls.LastIndex()
				if last == 0 {
					b.Skip("nothing stored")
				}
				var l raft.Log
				b.ReportAllocs()
				for i := range b.N {
					if err := ls.GetLog(uint64(i)%last+1, &l); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkEntryChecksum is what the checksum adds to an entry's store
// and read, without the log: sealEntry then openEntry.
func BenchmarkEntryChecksum(b *testing.B) {
	data := make([]byte, 400)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for range b.N {
		l := raft.Log{Index: 9, Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Unix(1, 2)}
		l.Extensions = sealEntry(&l)
		if err := openEntry(&l, 9, 1); err != nil {
			b.Fatal(err)
		}
	}
}
