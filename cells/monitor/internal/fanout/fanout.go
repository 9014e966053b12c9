// Package fanout delivers every value published to a Hub to each of its
// subscriptions, without ever waiting for one.
//
// Each subscription has a buffer of its own. Publish puts the value into
// every buffer that has room; a subscription whose buffer is full loses the
// value, and its Lost count says how many it lost. A slow subscriber
// therefore never slows the publisher, nor the other subscribers. Closing
// the hub closes every subscription's channel after what is buffered.
//
//	h := fanout.NewHub[Event]()
//	sub := h.Subscribe("api", 1024, nil)
//	go func() { for e := range sub.Events() { ... } }()
//	h.Publish(e)
package fanout

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Hub is a publisher's set of subscriptions. It is safe for concurrent use.
type Hub[E any] struct {
	mu     sync.Mutex
	subs   []*Subscription[E]
	closed bool
}

// NewHub returns a hub without subscriptions.
func NewHub[E any]() *Hub[E] { return &Hub[E]{} }

// Subscription receives the values published after it was made, up to its
// buffer; see the package documentation.
type Subscription[E any] struct {
	hub    *Hub[E]
	name   string
	ch     chan E
	lost   atomic.Uint64
	onLost func()
	// closed is guarded by hub.mu: the channel is closed under it, so that
	// Publish, which sends under it, never sends on a closed channel.
	closed bool
}

// Subscribe adds a subscription with room for buffer values (at least 1).
// onLost, if not nil, is called for each value the subscription loses,
// from the publisher's goroutine: it must be quick (a metric's Inc). On a
// closed hub the subscription is born closed.
func (h *Hub[E]) Subscribe(name string, buffer int, onLost func()) *Subscription[E] {
	if onLost == nil {
		onLost = func() {}
	}
	s := &Subscription[E]{hub: h, name: name, ch: make(chan E, max(buffer, 1)), onLost: onLost}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		s.closed = true
		close(s.ch)
		return s
	}
	h.subs = append(h.subs, s)
	return s
}

// Publish delivers e to every subscription with room for it and counts it
// lost for the others. It never blocks on a subscriber.
func (h *Hub[E]) Publish(e E) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.subs {
		select {
		case s.ch <- e:
		default:
			s.lost.Add(1)
			s.onLost()
		}
	}
}

// Len is the number of open subscriptions.
func (h *Hub[E]) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Close closes every subscription; later ones are born closed.
func (h *Hub[E]) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, s := range h.subs {
		s.closed = true
		close(s.ch)
	}
	h.subs = nil
}

// Name is the name the subscription was made with.
func (s *Subscription[E]) Name() string { return s.name }

// Events delivers the values. It is closed, after what is buffered, when
// the subscription or its hub is closed.
func (s *Subscription[E]) Events() <-chan E { return s.ch }

// Lost is how many values this subscription lost because its buffer was
// full.
func (s *Subscription[E]) Lost() uint64 { return s.lost.Load() }

// Close ends the subscription: nothing more is delivered, and Events is
// closed after what is buffered. Closing twice is harmless.
func (s *Subscription[E]) Close() {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	close(s.ch)
	h.subs = slices.DeleteFunc(h.subs, func(o *Subscription[E]) bool { return o == s })
}
