package fanout_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/cellium/cellium/cells/monitor/internal/fanout"
)

func drain[E any](s *fanout.Subscription[E]) []E {
	var got []E
	for {
		select {
		case e, ok := <-s.Events():
			if !ok {
				return got
			}
			got = append(got, e)
		default:
			return got
		}
	}
}

func TestEverySubscriberGetsEveryValueInOrder(t *testing.T) {
	h := fanout.NewHub[int]()
	a := h.Subscribe("a", 10, nil)
	b := h.Subscribe("b", 10, nil)
	for i := range 5 {
		h.Publish(i)
	}
	for _, s := range []*fanout.Subscription[int]{a, b} {
		if got := fmt.Sprint(drain(s)); got != "[0 1 2 3 4]" {
			t.Fatalf("%s got %s, want 0 to 4 in order", s.Name(), got)
		}
		if s.Lost() != 0 {
			t.Fatalf("%s lost %d with room to spare", s.Name(), s.Lost())
		}
	}
}

func TestFullSubscriberLosesAndCountsWithoutStallingOthers(t *testing.T) {
	h := fanout.NewHub[int]()
	var lostCalls int
	stalled := h.Subscribe("stalled", 3, func() { lostCalls++ })
	reader := h.Subscribe("reader", 1, nil)
	var got []int
	for i := range 100 {
		h.Publish(i)
		// The reader keeps up: it takes each value as it comes.
		got = append(got, <-reader.Events())
	}
	if len(got) != 100 || got[99] != 99 || reader.Lost() != 0 {
		t.Fatalf("reader got %d values (last %d), lost %d: want all 100", len(got), got[len(got)-1], reader.Lost())
	}
	if stalled.Lost() != 97 || lostCalls != 97 {
		t.Fatalf("stalled subscriber: Lost %d, onLost called %d times; want 97 each", stalled.Lost(), lostCalls)
	}
	if got := fmt.Sprint(drain(stalled)); got != "[0 1 2]" {
		t.Fatalf("stalled subscriber kept %s, want the first 3 values", got)
	}
}

// Under concurrency, every value is either delivered or counted lost, for
// every subscriber, and the publisher finishes although one subscriber
// never reads.
func TestConcurrentAccounting(t *testing.T) {
	const n = 100000
	h := fanout.NewHub[int]()
	stalled := h.Subscribe("stalled", 16, nil)
	readers := []*fanout.Subscription[int]{h.Subscribe("r1", 64, nil), h.Subscribe("r2", 4096, nil)}
	received := make([]int, len(readers))
	var wg sync.WaitGroup
	for i, r := range readers {
		wg.Go(func() {
			last := -1
			for e := range r.Events() {
				if e <= last {
					t.Errorf("%s: %d after %d, want increasing", r.Name(), e, last)
				}
				last = e
				received[i]++
			}
		})
	}
	for i := range n {
		h.Publish(i)
	}
	h.Close()
	wg.Wait()
	for i, r := range readers {
		if uint64(received[i])+r.Lost() != n {
			t.Fatalf("%s: received %d + lost %d != %d published", r.Name(), received[i], r.Lost(), n)
		}
	}
	if got := len(drain(stalled)); uint64(got)+stalled.Lost() != n || got != 16 {
		t.Fatalf("stalled: kept %d + lost %d, want 16 + %d", got, stalled.Lost(), n-16)
	}
}

func TestCloseSubscription(t *testing.T) {
	h := fanout.NewHub[int]()
	s := h.Subscribe("s", 4, nil)
	other := h.Subscribe("other", 4, nil)
	h.Publish(1)
	s.Close()
	s.Close()
	h.Publish(2)
	if got := fmt.Sprint(drain(s)); got != "[1]" {
		t.Fatalf("closed subscription delivered %s, want what was buffered before Close", got)
	}
	if _, ok := <-s.Events(); ok {
		t.Fatal("Events of a closed subscription is open")
	}
	if s.Lost() != 0 {
		t.Fatalf("closed subscription counted %d lost", s.Lost())
	}
	if h.Len() != 1 || fmt.Sprint(drain(other)) != "[1 2]" {
		t.Fatal("closing one subscription disturbed the other")
	}
}

func TestCloseHub(t *testing.T) {
	h := fanout.NewHub[int]()
	s := h.Subscribe("s", 4, nil)
	h.Publish(1)
	h.Close()
	if got := fmt.Sprint(drain(s)); got != "[1]" {
		t.Fatalf("after the hub closed: %s, want the buffered value", got)
	}
	if _, ok := <-s.Events(); ok {
		t.Fatal("Events open after the hub closed")
	}
	s.Close()
	late := h.Subscribe("late", 4, nil)
	if _, ok := <-late.Events(); ok {
		t.Fatal("a subscription to a closed hub is open")
	}
	h.Publish(2)
}

// Subscribing, publishing and closing at once is safe (run with -race).
func TestConcurrentSubscribeAndClose(t *testing.T) {
	h := fanout.NewHub[int]()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				h.Publish(i)
			}
		}
	})
	for range 1000 {
		s := h.Subscribe("s", 2, nil)
		<-s.Events()
		s.Close()
	}
	close(stop)
	wg.Wait()
	if h.Len() != 0 {
		t.Fatalf("%d subscriptions left open", h.Len())
	}
}

// BenchmarkPublish reports values per second through the hub to
// subscribers that keep up.
func BenchmarkPublish(b *testing.B) {
	for _, subs := range []int{1, 4} {
		b.Run(fmt.Sprintf("subscribers=%d", subs), func(b *testing.B) {
			h := fanout.NewHub[int]()
			var wg sync.WaitGroup
			for range subs {
				s := h.Subscribe("bench", 4096, nil)
				wg.Go(func() {
					for range s.Events() {
					}
				})
			}
			b.ResetTimer()
			for i := range b.N {
				h.Publish(i)
			}
			h.Close()
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "values/s")
		})
	}
}
