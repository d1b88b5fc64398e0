package router

import (
	"sync"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// WaitRegistry connects waiting Acquire RPCs to the hand-offs replicas
// apply. Pass its Observe to every local node (placement.NodeConfig
// Observer) and the registry to New. A hand-off wakes only the RPCs
// waiting for that request: no thundering herd, no polling.
type WaitRegistry struct {
	mu struct {
		sync.Mutex
		subs map[waitKey]map[*Subscription]struct{}
	}
}

// waitKey names a request; not its shard, since a split may move the
// queued request to another shard, whose grant the RPC still waits for.
type waitKey struct {
	resource, requestID string
}

// Subscription collects the events of its request: every local replica
// reports each hand-off, and events of an earlier queue entry of the same
// request id (an earlier attempt's timeout) may still arrive, so the
// waiting RPC filters by the entry's seq. notify is signalled whenever an
// event is added.
type Subscription struct {
	key    waitKey
	notify chan struct{}
	mu     sync.Mutex
	events []*shardv1.WaiterEvent
}

// take returns and clears the events received so far.
func (s *Subscription) take() []*shardv1.WaiterEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	evs := s.events
	s.events = nil
	return evs
}

// find returns the first received event of queue entry seq, or nil.
func (s *Subscription) find(seq uint64) *shardv1.WaiterEvent {
	for _, ev := range s.take() {
		if ev.GetSeq() == seq {
			return ev
		}
	}
	return nil
}

// maxPendingEvents bounds the events a subscription keeps between two
// looks: a hand-off is reported once per local replica.
const maxPendingEvents = 64

// NewWaitRegistry returns an empty registry.
func NewWaitRegistry() *WaitRegistry {
	w := &WaitRegistry{}
	w.mu.subs = map[waitKey]map[*Subscription]struct{}{}
	return w
}

// Subscribe registers interest in a request's hand-off. Subscribe before
// proposing, so that a grant applied at once is not missed.
func (w *WaitRegistry) Subscribe(resource, requestID string) *Subscription {
	s := &Subscription{key: waitKey{resource, requestID}, notify: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.subs[s.key] == nil {
		w.mu.subs[s.key] = map[*Subscription]struct{}{}
	}
	w.mu.subs[s.key][s] = struct{}{}
	return s
}

func (w *WaitRegistry) Unsubscribe(s *Subscription) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.mu.subs[s.key], s)
	if len(w.mu.subs[s.key]) == 0 {
		delete(w.mu.subs, s.key)
	}
}

// Observe is a shard.ApplyObserver: it hands each grant or drop to the
// RPCs waiting for it. It never blocks.
func (w *WaitRegistry) Observe(_ uint64, res *shardv1.Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	notify := func(ev *shardv1.WaiterEvent) {
		for s := range w.mu.subs[waitKey{ev.GetResource(), ev.GetRequestId()}] {
			s.mu.Lock()
			if len(s.events) < maxPendingEvents {
				s.events = append(s.events, ev)
			}
			s.mu.Unlock()
			select {
			case s.notify <- struct{}{}:
			default: // already signalled
			}
		}
	}
	for _, ev := range res.GetGranted() {
		notify(ev)
	}
	for _, ev := range res.GetDropped() {
		notify(ev)
	}
}
