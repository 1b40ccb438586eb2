package gossip

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// EventKind says what happened to a member.
type EventKind uint8

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFail:
		return "fail"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is one membership change.
type Event struct {
	Kind EventKind
	Node NodeMeta
	// At is when this node processed the change.
	At time.Time
}

// MemberState is the state of a known member.
type MemberState uint8

func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateLeft:
		return "left"
	case StateFailed:
		return "failed"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// MemberStatus is a known member with its state and when it last changed.
type MemberStatus struct {
	Meta  NodeMeta
	State MemberState
	Since time.Time
}

// Subscribe returns a channel of membership events and a function that
// ends the subscription (idempotent). The channel first carries an
// EventJoin for every member alive at the call, then every change in
// order; each subscriber has its own unbounded queue, so a slow one delays
// nobody. The channel is closed after cancel or Shutdown.
func (g *Gossip) Subscribe() (<-chan Event, func()) {
	s := newSubscriber()
	g.mu.Lock()
	if g.subs == nil { // shut down
		g.mu.Unlock()
		close(s.ch)
		close(s.done)
		return s.ch, func() {}
	}
	now := time.Now()
	ids := make([]string, 0, len(g.members))
	for id, st := range g.members {
		if st.State == StateAlive {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		s.push(Event{Kind: EventJoin, Node: g.members[id].Meta, At: now})
	}
	g.subs[s] = struct{}{}
	g.mu.Unlock()
	go s.run()
	return s.ch, func() {
		g.mu.Lock()
		delete(g.subs, s)
		g.mu.Unlock()
		s.cancel()
		<-s.done
	}
}

// drain applies memberlist's events in order until stop.
func (g *Gossip) drain() {
	defer g.wg.Done()
	var batch []queuedEvent
	for {
		select {
		case <-g.stop:
			return
		case <-g.queue.wake:
		}
		batch = g.queue.take(batch[:0])
		for i := range batch {
			g.apply(batch[i])
			batch[i] = queuedEvent{}
		}
	}
}

func (g *Gossip) apply(ev queuedEvent) {
	if ev.notice != "" {
		g.applyLeaveNotice(ev.notice)
		return
	}
	var meta NodeMeta
	if err := meta.UnmarshalBinary(ev.Node.Meta); err != nil {
		g.log.Warn("ignoring member with bad metadata", "member", ev.Node.Name, "addr", ev.Node.Address(), "err", err)
		return
	}
	if meta.ID != ev.Node.Name {
		g.log.Warn("ignoring member whose metadata names another node", "member", ev.Node.Name, "meta_id", meta.ID)
		return
	}
	meta.GossipAddr = ev.Node.Address()
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch ev.Event {
	case memberlist.NodeJoin:
		delete(g.leaving, meta.ID)
		g.record(EventJoin, meta, StateAlive, now)
	case memberlist.NodeUpdate:
		if st := g.members[meta.ID]; st != nil && st.State == StateAlive {
			now = st.Since // alive since then still
		}
		g.record(EventUpdate, meta, StateAlive, now)
	case memberlist.NodeLeave:
		_, noticed := g.leaving[meta.ID]
		delete(g.leaving, meta.ID)
		if noticed || meta.Leaving {
			g.record(EventLeave, meta, StateLeft, now)
		} else {
			g.record(EventFail, meta, StateFailed, now)
		}
	}
}

// applyLeaveNotice handles a leave notice (msgLeaving) from member id. A
// notice from a member this node already holds failed turns it into a
// member that left at once: memberlist ignores the dead message that
// follows for a member it holds dead, so no NodeLeave would ever come for
// it. Otherwise the notice is remembered, so that the death that follows
// counts as a leave.
func (g *Gossip) applyLeaveNotice(id string) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.members[id]; st != nil && st.State == StateFailed {
		g.record(EventLeave, st.Meta, StateLeft, now)
		return
	}
	if len(g.leaving) < 4096 { // bounded whatever peers send
		g.leaving[id] = now
	}
}

// record is the one place where a member's status changes: it stores the
// member in state since since (with the Leaving flag that state implies),
// forgets members gone for longer than DeadRetention and stale leave
// notices, and tells the subscribers. The event carries exactly the
// metadata that Status reports. g.mu is held.
func (g *Gossip) record(kind EventKind, meta NodeMeta, state MemberState, since time.Time) {
	switch state {
	case StateLeft:
		meta.Leaving = true
	case StateFailed:
		meta.Leaving = false
	}
	now := time.Now()
	g.members[meta.ID] = &MemberStatus{Meta: meta, State: state, Since: since}
	for id, m := range g.members {
		if m.State != StateAlive && now.Sub(m.Since) > g.cfg.DeadRetention {
			delete(g.members, id)
		}
	}
	for id, at := range g.leaving {
		if now.Sub(at) > time.Minute {
			delete(g.leaving, id) // a notice whose death never came
		}
	}
	g.log.Debug("membership", "event", kind, "member", meta.ID, "addr", meta.GossipAddr, "state", state)
	out := Event{Kind: kind, Node: meta, At: now}
	for s := range g.subs {
		s.push(out)
	}
}

// eventQueue is memberlist's EventDelegate: it queues without blocking
// (memberlist calls it holding its node lock, and a blocked send there, as
// ChannelEventDelegate can do, would stall failure detection) and wakes
// drain. Leave notices (NotifyMsg) go through it too, so that drain alone
// changes members, in the order things arrived.
type eventQueue struct {
	mu   sync.Mutex
	q    []queuedEvent
	wake chan struct{}
}

// queuedEvent is a memberlist event, or, when notice is set, a leave
// notice from the member of that ID.
type queuedEvent struct {
	memberlist.NodeEvent
	notice string
}

func (q *eventQueue) init() { q.wake = make(chan struct{}, 1) }

func (q *eventQueue) put(kind memberlist.NodeEventType, n *memberlist.Node) {
	node := *n
	node.Meta = slices.Clone(n.Meta)
	q.push(queuedEvent{NodeEvent: memberlist.NodeEvent{Event: kind, Node: &node}})
}

func (q *eventQueue) push(e queuedEvent) {
	q.mu.Lock()
	q.q = append(q.q, e)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take(dst []queuedEvent) []queuedEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, q.q...)
	clear(q.q)
	q.q = q.q[:0]
	return dst
}

// NotifyJoin implements memberlist.EventDelegate.
func (q *eventQueue) NotifyJoin(n *memberlist.Node) { q.put(memberlist.NodeJoin, n) }

// NotifyLeave implements memberlist.EventDelegate.
func (q *eventQueue) NotifyLeave(n *memberlist.Node) { q.put(memberlist.NodeLeave, n) }

// NotifyUpdate implements memberlist.EventDelegate.
func (q *eventQueue) NotifyUpdate(n *memberlist.Node) { q.put(memberlist.NodeUpdate, n) }

// subscriber forwards its queue to ch from its own goroutine.
type subscriber struct {
	ch       chan Event
	mu       sync.Mutex
	q        []Event
	wake     chan struct{}
	quit     chan struct{}
	quitOnce sync.Once
	done     chan struct{} // closed when run has returned and ch is closed
}

func newSubscriber() *subscriber {
	return &subscriber{
		ch:   make(chan Event),
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
}

func (s *subscriber) push(e Event) {
	s.mu.Lock()
	s.q = append(s.q, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) cancel() { s.quitOnce.Do(func() { close(s.quit) }) }

func (s *subscriber) run() {
	defer close(s.done)
	defer close(s.ch)
	for {
		s.mu.Lock()
		if len(s.q) == 0 {
			s.mu.Unlock()
			select {
			case <-s.quit:
				return
			case <-s.wake:
				continue
			}
		}
		e := s.q[0]
		s.q[0] = Event{}
		s.q = s.q[1:]
		s.mu.Unlock()
		select {
		case <-s.quit:
			return
		case s.ch <- e:
		}
	}
}
