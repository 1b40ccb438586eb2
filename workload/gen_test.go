package workload

import (
	"reflect"
	"slices"
	"testing"
)

func TestGeneratorsDeterministic(t *testing.T) {
	cfg := smallCorpus()
	a, b := NewCorpus(cfg), NewCorpus(cfg)
	cfg2 := cfg
	cfg2.Seed++
	other := NewCorpus(cfg2)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two corpora from one seed differ")
	}
	if reflect.DeepEqual(a.Passages, other.Passages) {
		t.Fatal("corpora from different seeds are equal")
	}
	tests := []struct {
		name string
		gen  func(c *Corpus, seed uint64) any
	}{
		{"rag k=4", func(c *Corpus, s uint64) any { return c.RAGRequests(s, 20, 4, 1.5, 5) }},
		{"rag k=8", func(c *Corpus, s uint64) any { return c.RAGRequests(s, 20, 8, 1.5, 5) }},
		{"chat", func(c *Corpus, s uint64) any { return c.Conversations(s, 4, ChatConfig{}) }},
		{"facts", func(_ *Corpus, s uint64) any { return Facts(s, 10, 24, 256) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, y, z := tc.gen(a, 11), tc.gen(b, 11), tc.gen(a, 12)
			if !reflect.DeepEqual(x, y) {
				t.Fatal("same seed, different output")
			}
			if reflect.DeepEqual(x, z) {
				t.Fatal("different seeds, same output")
			}
		})
	}
}

func TestCorpusShape(t *testing.T) {
	cfg := smallCorpus()
	c := NewCorpus(cfg)
	if len(c.Passages) != cfg.Passages || len(c.System) != cfg.SystemLen {
		t.Fatalf("%d passages, system of %d", len(c.Passages), len(c.System))
	}
	for i, p := range c.Passages {
		if len(p) < cfg.MinTokens || len(p) > cfg.MaxTokens {
			t.Fatalf("passage %d has %d tokens", i, len(p))
		}
		for _, tok := range p {
			if int(tok) >= 4096 {
				t.Fatalf("token %d outside the vocabulary", tok)
			}
		}
	}
}

func TestRAGRequestsReorder(t *testing.T) {
	c := NewCorpus(smallCorpus())
	for _, k := range []int{4, 8} {
		reqs := c.RAGRequests(5, 60, k, 1.5, 5)
		orders := map[int]map[string]bool{}
		firsts := map[int]map[int]bool{}
		for _, r := range reqs {
			if len(r.Passages) != k || len(r.Question) != 5 {
				t.Fatalf("k=%d: request with %d passages, %d-token question", k, len(r.Passages), len(r.Question))
			}
			s := slices.Clone(r.Passages)
			slices.Sort(s)
			if len(slices.Compact(s)) != k {
				t.Fatalf("k=%d: repeated passage in %v", k, r.Passages)
			}
			if !slices.Contains(c.topics[r.Topic], r.Passages[0]) {
				t.Fatalf("passage %d not of topic %d", r.Passages[0], r.Topic)
			}
			if orders[r.Topic] == nil {
				orders[r.Topic], firsts[r.Topic] = map[string]bool{}, map[int]bool{}
			}
			orders[r.Topic][stringOf(r.Passages)] = true
			firsts[r.Topic][r.Passages[0]] = true
		}
		// The most popular topic is asked often and retrieved in several
		// orders: what breaks prefix caching.
		if len(orders[0]) < 3 {
			t.Fatalf("k=%d: topic 0 retrieved in %d orders", k, len(orders[0]))
		}
		segs := c.Segments(reqs[0])
		if len(segs) != k+2 || !segs[0].Chunk || segs[k+1].Chunk {
			t.Fatalf("segments %d, first chunk %v, last chunk %v", len(segs), segs[0].Chunk, segs[k+1].Chunk)
		}
	}
}

func stringOf(p []int) string {
	b := make([]byte, 0, 4*len(p))
	for _, x := range p {
		b = append(b, byte(x), byte(x>>8), ',')
	}
	return string(b)
}

func TestConversationPrompts(t *testing.T) {
	c := NewCorpus(smallCorpus())
	for _, conv := range c.Conversations(9, 5, ChatConfig{Turns: 8}) {
		if len(conv.Turns) != 8 {
			t.Fatalf("%d turns", len(conv.Turns))
		}
		for tt := range conv.Turns {
			p, s := c.Prompt(conv, tt), c.Served(conv, tt)
			// The prompt is what was served minus the reply, except that the
			// user's message is text until it has been answered.
			if len(s) != len(p)+1 || p[len(p)-1].Chunk || !slices.Equal(p[len(p)-1].Tokens, s[len(s)-2].Tokens) {
				t.Fatalf("turn %d: prompt of %d segments, served %d", tt, len(p), len(s))
			}
			for i := range p[:len(p)-1] {
				if !p[i].Chunk || !slices.Equal(p[i].Tokens, s[i].Tokens) {
					t.Fatalf("turn %d: segment %d differs from the served history", tt, i)
				}
			}
			if tt+1 < len(conv.Turns) {
				next := c.Prompt(conv, tt+1)
				for i := range s {
					if !slices.Equal(s[i].Tokens, next[i].Tokens) {
						t.Fatalf("turn %d: the next prompt does not start with this turn's history", tt)
					}
				}
			}
		}
	}
}
