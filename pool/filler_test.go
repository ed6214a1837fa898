package pool

import (
	"context"
	"testing"
	"time"
)

// TestWaitQuiet checks the filler's quiet period after warm leases: it waits refillQuiet
// after the last lease while the pool has a ready sandbox, never more than refillMaxDefer
// however often leases come, and not at all once the pool is empty or no lease came lately.
func TestWaitQuiet(t *testing.T) {
	m := &Manager{}
	ctx := context.Background()
	newPool := func(ready int, lastLease time.Time) *pool {
		return &pool{ready: make([]*sandbox, ready), lastLease: lastLease, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	}
	timeWait := func(p *pool) time.Duration {
		start := time.Now()
		if !m.waitQuiet(ctx, p) {
			t.Fatal("waitQuiet: false without a stop")
		}
		return time.Since(start)
	}

	if d := timeWait(newPool(3, time.Time{})); d > 5*time.Millisecond {
		t.Errorf("no lease yet: waited %v", d)
	}
	if d := timeWait(newPool(0, time.Now())); d > 5*time.Millisecond {
		t.Errorf("empty pool: waited %v, want a refill at once", d)
	}
	if d := timeWait(newPool(3, time.Now())); d < refillQuiet-time.Millisecond || d > refillMaxDefer {
		t.Errorf("after a lease: waited %v, want ~%v", d, refillQuiet)
	}

	// Leases every 5 ms: the wait is cut at refillMaxDefer.
	p := newPool(3, time.Now())
	done, exited := make(chan struct{}), make(chan struct{})
	go func(p *pool) { // its own p: the test's is reassigned below
		defer close(exited)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				m.mu.Lock()
				p.lastLease = time.Now()
				m.mu.Unlock()
				p.poke()
			}
		}
	}(p)
	d := timeWait(p)
	close(done)
	<-exited
	if d < refillMaxDefer-time.Millisecond || d > refillMaxDefer+100*time.Millisecond {
		t.Errorf("leases every 5 ms: waited %v, want %v", d, refillMaxDefer)
	}

	// The pool emptied during the wait: the refill starts on the lease's poke.
	p = newPool(1, time.Now())
	go func() {
		time.Sleep(5 * time.Millisecond)
		m.mu.Lock()
		p.ready = p.ready[:0]
		p.lastLease = time.Now()
		m.mu.Unlock()
		p.poke()
	}()
	if d := timeWait(p); d > refillQuiet {
		t.Errorf("pool emptied: waited %v", d)
	}

	p = newPool(3, time.Now())
	close(p.stop)
	if m.waitQuiet(ctx, p) {
		t.Error("stopped pool: waitQuiet true")
	}
}
