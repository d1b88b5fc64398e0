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
		subs map[waitKey]map[*subscription]struct{}
	}
}

type waitKey struct {
	shardID             uint64
	resource, requestID string
}

// subscription receives the one event its RPC waits for. The channel has
// room for one event; every local replica reports the same hand-off, and
// only the first is kept.
type subscription struct {
	key waitKey
	ch  chan *shardv1.WaiterEvent
}

// NewWaitRegistry returns an empty registry.
func NewWaitRegistry() *WaitRegistry {
	w := &WaitRegistry{}
	w.mu.subs = map[waitKey]map[*subscription]struct{}{}
	return w
}

// subscribe registers interest in a request's hand-off. Subscribe before
// proposing, so that a grant applied at once is not missed.
func (w *WaitRegistry) subscribe(shardID uint64, resource, requestID string) *subscription {
	s := &subscription{key: waitKey{shardID, resource, requestID}, ch: make(chan *shardv1.WaiterEvent, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.subs[s.key] == nil {
		w.mu.subs[s.key] = map[*subscription]struct{}{}
	}
	w.mu.subs[s.key][s] = struct{}{}
	return s
}

func (w *WaitRegistry) unsubscribe(s *subscription) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.mu.subs[s.key], s)
	if len(w.mu.subs[s.key]) == 0 {
		delete(w.mu.subs, s.key)
	}
}

// Observe is a shard.ApplyObserver: it hands each grant or drop to the
// RPCs waiting for it. It never blocks.
func (w *WaitRegistry) Observe(shardID uint64, res *shardv1.Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	notify := func(ev *shardv1.WaiterEvent) {
		for s := range w.mu.subs[waitKey{shardID, ev.GetResource(), ev.GetRequestId()}] {
			select {
			case s.ch <- ev:
			default: // already told, by another replica
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
