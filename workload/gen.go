package workload

import (
	"cmp"
	"math/rand/v2"
	"slices"

	"github.com/kvmesh/kvmesh/engine"
)

// CorpusConfig shapes a RAG corpus. Zero fields take the defaults shown.
type CorpusConfig struct {
	Passages  int // passages in the corpus; 96
	MinTokens int // shortest passage; 64
	MaxTokens int // longest passage; 128
	Topics    int // topics requests are about; 8
	TopicSize int // passages relevant to a topic (>= the largest k); 24
	SystemLen int // tokens of the system prompt every request starts with; 32
	Vocab     int // token IDs are drawn from [0, Vocab); 4096
	Seed      uint64
}

func (c *CorpusConfig) defaults() {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&c.Passages, 96)
	def(&c.MinTokens, 64)
	def(&c.MaxTokens, 128)
	def(&c.Topics, 8)
	def(&c.TopicSize, 24)
	def(&c.SystemLen, 32)
	def(&c.Vocab, 4096)
	c.MaxTokens = max(c.MaxTokens, c.MinTokens)
	c.TopicSize = min(c.TopicSize, c.Passages)
}

// Corpus is a generated document collection: a system prompt, passages, and
// per topic the passages a retriever finds relevant with their base scores.
type Corpus struct {
	Config   CorpusConfig
	System   []uint32
	Passages [][]uint32
	// topics[t] lists passage indices relevant to topic t, most relevant
	// first; a request's reranker scores them around their rank.
	topics [][]int
}

// NewCorpus generates a corpus from cfg.Seed.
func NewCorpus(cfg CorpusConfig) *Corpus {
	cfg.defaults()
	r := rand.New(rand.NewPCG(cfg.Seed, 0x636f72707573))
	c := &Corpus{Config: cfg, System: randTokens(r, cfg.SystemLen, cfg.Vocab)}
	c.Passages = make([][]uint32, cfg.Passages)
	for i := range c.Passages {
		c.Passages[i] = randTokens(r, cfg.MinTokens+r.IntN(cfg.MaxTokens-cfg.MinTokens+1), cfg.Vocab)
	}
	c.topics = make([][]int, cfg.Topics)
	for t := range c.topics {
		c.topics[t] = r.Perm(cfg.Passages)[:cfg.TopicSize]
	}
	return c
}

func randTokens(r *rand.Rand, n, vocab int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(vocab))
	}
	return out
}

// RAGRequest is one retrieval-augmented prompt: the system prompt, k
// passages in the order the reranker put them, then a question.
type RAGRequest struct {
	Topic    int
	Passages []int // indices into Corpus.Passages, in prompt order
	Question []uint32
}

// RAGRequests draws n requests of k passages each from seed. Topics are
// Zipf-like in popularity (topic t has weight 1/(t+1)); a request scores its
// topic's passages as rank + Gaussian noise of standard deviation noise
// (in ranks) and keeps the best k in score order, so requests on one topic
// retrieve overlapping passages in orders that vary as a reranker's do.
func (c *Corpus) RAGRequests(seed uint64, n, k int, noise float64, questionLen int) []RAGRequest {
	r := rand.New(rand.NewPCG(seed, 0x7261675f7271))
	k = min(k, c.Config.TopicSize)
	weights := make([]float64, len(c.topics))
	var total float64
	for t := range weights {
		weights[t] = 1 / float64(t+1)
		total += weights[t]
	}
	out := make([]RAGRequest, n)
	type scored struct {
		p int
		s float64
	}
	sc := make([]scored, c.Config.TopicSize)
	for i := range out {
		u, t := r.Float64()*total, 0
		for t < len(weights)-1 && u >= weights[t] {
			u -= weights[t]
			t++
		}
		for j, p := range c.topics[t] {
			sc[j] = scored{p, float64(j) + noise*r.NormFloat64()}
		}
		slices.SortStableFunc(sc, func(a, b scored) int { return cmp.Compare(a.s, b.s) })
		ps := make([]int, k)
		for j := range ps {
			ps[j] = sc[j].p
		}
		out[i] = RAGRequest{Topic: t, Passages: ps, Question: randTokens(r, questionLen, c.Config.Vocab)}
	}
	return out
}

// Segments is req's prompt: the system prompt and the passages as chunks
// (the store may hold them), the question as text (always prefilled).
func (c *Corpus) Segments(req RAGRequest) []engine.Segment {
	segs := make([]engine.Segment, 0, len(req.Passages)+2)
	segs = append(segs, engine.Segment{Tokens: c.System, Chunk: true})
	for _, p := range req.Passages {
		segs = append(segs, engine.Segment{Tokens: c.Passages[p], Chunk: true})
	}
	return append(segs, engine.Segment{Tokens: req.Question})
}

// ChatConfig shapes multi-turn conversations. Zero fields take the
// defaults shown.
type ChatConfig struct {
	Turns              int     // turns per conversation; 8
	UserMin, UserMax   int     // tokens of a user message; 16, 48
	ReplyMin, ReplyMax int     // tokens of an assistant reply; 24, 64
	QuoteProb          float64 // chance a turn quotes a document; 0.5
	// RequoteProb is the chance a quoting turn quotes a document the
	// conversation quoted before rather than a new one; 0.3.
	RequoteProb float64
}

func (c *ChatConfig) defaults() {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&c.Turns, 8)
	def(&c.UserMin, 16)
	def(&c.UserMax, 48)
	def(&c.ReplyMin, 24)
	def(&c.ReplyMax, 64)
	c.UserMax = max(c.UserMax, c.UserMin)
	c.ReplyMax = max(c.ReplyMax, c.ReplyMin)
	if c.QuoteProb == 0 {
		c.QuoteProb = 0.5
	}
	if c.RequoteProb == 0 {
		c.RequoteProb = 0.3
	}
}

// Turn is one exchange: an optional quoted document (a corpus passage),
// the user's message and the assistant's reply.
type Turn struct {
	Quote int // passage index, or -1
	User  []uint32
	Reply []uint32
}

// Conversation is a chat; turn t's prompt is the system prompt, every
// earlier turn (quote, user, reply) and turn t's quote and user message.
type Conversation struct {
	Turns []Turn
}

// Conversations draws n conversations from seed.
func (c *Corpus) Conversations(seed uint64, n int, cfg ChatConfig) []Conversation {
	cfg.defaults()
	r := rand.New(rand.NewPCG(seed, 0x63686174))
	v := c.Config.Vocab
	out := make([]Conversation, n)
	for i := range out {
		var quoted []int
		turns := make([]Turn, cfg.Turns)
		for t := range turns {
			q := -1
			if r.Float64() < cfg.QuoteProb {
				if len(quoted) > 0 && r.Float64() < cfg.RequoteProb {
					q = quoted[r.IntN(len(quoted))]
				} else {
					q = r.IntN(len(c.Passages))
					quoted = append(quoted, q)
				}
			}
			turns[t] = Turn{
				Quote: q,
				User:  randTokens(r, cfg.UserMin+r.IntN(cfg.UserMax-cfg.UserMin+1), v),
				Reply: randTokens(r, cfg.ReplyMin+r.IntN(cfg.ReplyMax-cfg.ReplyMin+1), v),
			}
		}
		out[i] = Conversation{Turns: turns}
	}
	return out
}

// Prompt is turn t's prompt. The history's pieces are chunks; turn t's user
// message is text, since nothing can have cached it yet.
func (c *Corpus) Prompt(conv Conversation, t int) []engine.Segment {
	segs := c.history(conv, t)
	if q := conv.Turns[t].Quote; q >= 0 {
		segs = append(segs, engine.Segment{Tokens: c.Passages[q], Chunk: true})
	}
	return append(segs, engine.Segment{Tokens: conv.Turns[t].User})
}

// Served is what the engine holds after answering turn t: its prompt and
// reply, every piece a chunk, as it writes them back to the store.
func (c *Corpus) Served(conv Conversation, t int) []engine.Segment {
	segs := c.history(conv, t+1)
	return segs
}

func (c *Corpus) history(conv Conversation, t int) []engine.Segment {
	segs := []engine.Segment{{Tokens: c.System, Chunk: true}}
	for _, tr := range conv.Turns[:t] {
		if tr.Quote >= 0 {
			segs = append(segs, engine.Segment{Tokens: c.Passages[tr.Quote], Chunk: true})
		}
		segs = append(segs, engine.Segment{Tokens: tr.User, Chunk: true}, engine.Segment{Tokens: tr.Reply, Chunk: true})
	}
	return segs
}

// Facts is a per-user memory store: n facts of the given length.
func Facts(seed uint64, n, tokens, vocab int) [][]uint32 {
	r := rand.New(rand.NewPCG(seed, 0x6d656d6f7279))
	out := make([][]uint32, n)
	for i := range out {
		out[i] = randTokens(r, tokens, vocab)
	}
	return out
}
