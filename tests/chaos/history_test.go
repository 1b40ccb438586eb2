package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// Op is one recorded operation or event of a run. History holds them in
// completion order and writes them out as JSON lines when a run fails.
type Op struct {
	Start    time.Duration `json:"start"` // since the run began
	End      time.Duration `json:"end"`
	Worker   int           `json:"worker"` // -1: the fault schedule or the checker
	Kind     string        `json:"kind"`   // put, get, lookup, register, inject, register-cache, fault, heal, finding
	Key      int           `json:"key"`    // key index, -1 if none
	OK       bool          `json:"ok"`
	StoredOn []string      `json:"stored_on,omitempty"`
	Err      string        `json:"err,omitempty"`
	Detail   string        `json:"detail,omitempty"`
	Wrong    bool          `json:"wrong,omitempty"` // returned bytes other than written
}

// keyState is what the checker knows of one key.
type keyState struct {
	key   chunk.Key
	blob  []byte
	acked bool
	// holders are the nodes known to hold the written bytes and not
	// restarted since (a restart empties a node's DRAM tier).
	holders map[string]bool
}

// History is the shared record of a run: the operations, the state of
// every key, and the node generations (bumped at every restart).
type History struct {
	t0 time.Time

	mu      sync.Mutex
	ops     []Op
	keys    map[int]*keyState
	byKey   map[chunk.Key]int
	order   []int // base keys (index < variantBase) in the order attempted
	gen     map[string]int
	models  map[string]bool // fingerprint -> acknowledged
	faults  int
	wrong   int
	unavail int
	inj     InjectTally
}

// NewHistory starts a history at t0.
func NewHistory(t0 time.Time) *History {
	return &History{t0: t0, keys: make(map[int]*keyState), byKey: make(map[chunk.Key]int), gen: make(map[string]int), models: make(map[string]bool)}
}

// Since is the run-relative time of now.
func (h *History) Since() time.Duration { return time.Since(h.t0) }

// Record appends op, counting wrong reads.
func (h *History) Record(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if op.Wrong {
		h.wrong++
	}
	if op.Kind == "fault" {
		h.faults++
	}
	h.ops = append(h.ops, op)
}

// Generations snapshots every node's restart count; a put passes it to
// Acked so that a node restarted while the put ran does not count as a
// holder.
func (h *History) Generations() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.gen)
}

// Restarted notes that node lost its DRAM contents (SIGKILL or a clean
// restart alike): it holds nothing it held before.
func (h *History) Restarted(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen[node]++
	for _, k := range h.keys {
		delete(k.holders, node)
	}
}

// Attempt registers key i before its first put.
func (h *History) Attempt(i int, key chunk.Key, blob []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys[i] == nil {
		h.keys[i] = &keyState{key: key, blob: blob, holders: make(map[string]bool)}
		h.byKey[key] = i
		if i < variantBase {
			h.order = append(h.order, i)
		}
	}
}

// Entry returns the blob attempted under key (nil if none ever was) and
// whether it was acknowledged.
func (h *History) Entry(key chunk.Key) (blob []byte, acked bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i, ok := h.byKey[key]
	if !ok {
		return nil, false
	}
	return h.keys[i].blob, h.keys[i].acked
}

// Acked marks key i acknowledged by storedOn, counting only nodes not
// restarted since gen was taken.
func (h *History) Acked(i int, storedOn []string, gen map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.keys[i]
	k.acked = true
	for _, n := range storedOn {
		if h.gen[n] == gen[n] {
			k.holders[n] = true
		}
	}
}

// Holds notes that a direct read found node holding key i's bytes.
func (h *History) Holds(i int, node string, gen int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen[node] == gen {
		h.keys[i].holders[node] = true
	}
}

// HeldBy lists the acknowledged keys node is known to hold.
func (h *History) HeldBy(node string) []KeyCheck {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []KeyCheck
	for i, k := range h.keys {
		if k.acked && k.holders[node] {
			out = append(out, KeyCheck{Index: i, Key: k.key, Blob: k.blob, Holders: len(k.holders)})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Index < out[b].Index })
	return out
}

// ModelAcked records an acknowledged model registration.
func (h *History) ModelAcked(fp string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.models[fp] = true
}

// Models are the acknowledged registrations, sorted.
func (h *History) Models() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.models))
}

// Key returns key i (written or not).
func (h *History) Key(i int) (chunk.Key, []byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.keys[i]
	if k == nil {
		return chunk.Key{}, nil, false
	}
	return k.key, k.blob, true
}

// RandomKey picks an attempted base key (a standalone entry; variants
// are not picked) with rng, or -1 when there is none.
func (h *History) RandomKey(rng *rand.Rand) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.order) == 0 {
		return -1
	}
	// Workers attempt keys in about index order, not exactly: pick among
	// those attempted.
	return h.order[rng.IntN(len(h.order))]
}

// KeyCheck is the view of one acknowledged key that Check needs.
type KeyCheck struct {
	Index   int
	Key     chunk.Key
	Blob    []byte
	Holders int
}

// AckedKeys lists acknowledged keys with their current holder count.
func (h *History) AckedKeys() []KeyCheck {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []KeyCheck
	for i, k := range h.keys {
		if k.acked {
			out = append(out, KeyCheck{Index: i, Key: k.key, Blob: k.blob, Holders: len(k.holders)})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Index < out[b].Index })
	return out
}

// AllKeys lists every attempted key (acknowledged or not).
func (h *History) AllKeys() []KeyCheck {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]KeyCheck, 0, len(h.keys))
	for i, k := range h.keys {
		out = append(out, KeyCheck{Index: i, Key: k.key, Blob: k.blob, Holders: len(k.holders)})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Index < out[b].Index })
	return out
}

// InjectTally counts injections and their chunks by answer.
type InjectTally struct {
	Injections int // answered Inject calls (failed calls are failed ops)
	Exact      int
	Approx     int
	Miss       int
	// ApproxOverExact counts APPROXIMATE answers for a chunk whose
	// wanted-context entry was acknowledged before the call: allowed
	// while faults last (see checkInjection), never in the final pass.
	ApproxOverExact int
	Wrong           int // chunks with any wrong byte or a forbidden answer
}

// Add adds o to t.
func (t *InjectTally) Add(o InjectTally) {
	t.Injections += o.Injections
	t.Exact += o.Exact
	t.Approx += o.Approx
	t.Miss += o.Miss
	t.ApproxOverExact += o.ApproxOverExact
	t.Wrong += o.Wrong
}

// Injected adds an answered injection's tally.
func (h *History) Injected(t InjectTally) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inj.Add(t)
}

// Counts are the totals the summary line reports.
type Counts struct {
	Ops, Acked, Faults, Wrong, Unavailable int
	Inject                                 InjectTally
}

// Counts totals the history so far.
func (h *History) Counts() Counts {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := Counts{Faults: h.faults, Wrong: h.wrong, Inject: h.inj}
	for _, op := range h.ops {
		if op.Worker >= 0 {
			c.Ops++
			if !op.OK {
				c.Unavailable++
			}
		}
	}
	for _, k := range h.keys {
		if k.acked {
			c.Acked++
		}
	}
	return c
}

// WriteJSON writes the operations as JSON lines.
func (h *History) WriteJSON(w io.Writer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	enc := json.NewEncoder(w)
	for _, op := range h.ops {
		if err := enc.Encode(op); err != nil {
			return err
		}
	}
	return nil
}

// ReadResult is what a final read of one acknowledged key returned.
type ReadResult struct {
	Got []byte
	Err error
}

// Verdict is the checker's judgment of the final reads.
type Verdict struct {
	Lost        []int // acked, >= W holders survived, not readable bit-exact
	Wrong       []int // returned bytes other than written
	Unprotected []int // acked, fewer than W holders survived, not readable: allowed
}

// Check judges the final read of every acknowledged key: a key that at
// least w of its holders survived must read back bit-exact; no key may
// ever read back other bytes.
func Check(keys []KeyCheck, reads map[int]ReadResult, w int) Verdict {
	var v Verdict
	for _, k := range keys {
		r, ok := reads[k.Index]
		switch {
		case ok && r.Err == nil && bytes.Equal(r.Got, k.Blob):
		case ok && r.Err == nil:
			v.Wrong = append(v.Wrong, k.Index)
		case k.Holders >= w:
			v.Lost = append(v.Lost, k.Index)
		default:
			v.Unprotected = append(v.Unprotected, k.Index)
		}
	}
	return v
}

// Percentiles returns p50 and max of ds (zero when empty).
func Percentiles(ds []time.Duration) (p50, max time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2], s[len(s)-1]
}

// AgreeViews reports how per-node metadata views differ, or "" when they
// agree and include every model in want.
func AgreeViews(views map[string]string, models map[string][]string, want []string) string {
	var diffs []string
	var first string
	for _, id := range slices.Sorted(maps.Keys(views)) {
		if first == "" {
			first = views[id]
		} else if views[id] != first {
			diffs = append(diffs, fmt.Sprintf("%s sees %q, not %q", id, views[id], first))
		}
		have := make(map[string]bool)
		for _, m := range models[id] {
			have[m] = true
		}
		for _, m := range want {
			if !have[m] {
				diffs = append(diffs, fmt.Sprintf("%s lacks acknowledged model %s", id, m))
				break
			}
		}
	}
	return strings.Join(diffs, "; ")
}
