package pool

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// releaseKillTimeout bounds how long release waits for a sandbox's processes to die.
const releaseKillTimeout = 10 * time.Second

// watch fences sb as soon as the init it was started with exits unexpectedly (the pidfd's
// exit notification, the same moment containerd's task exit event fires): a leased sandbox
// is marked failed, so every call on it fails with failed_precondition until it is
// released (and destroyed); a ready one is taken out of the pool and destroyed.
func (m *Manager) watch(sb *sandbox, ref *initRef) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-ref.exited:
		case <-ref.done:
			return
		case <-m.ctx.Done():
			return
		}
		m.fence(sb, ref)
	}()
}

func (m *Manager) fence(sb *sandbox, ref *initRef) {
	ref.mu.Lock()
	expected := ref.retired
	ref.mu.Unlock()
	if expected {
		return
	}
	ctx := log.With(m.ctx, "container", sb.rec.CID)
	m.mu.Lock()
	p := m.pools[sb.rec.Pool]
	ready := p != nil && removeReady(p, sb)
	m.mu.Unlock()
	why, attrs := m.initExitReason(ctx, sb, ref) // meanwhile every use fails: r.exited is closed
	ref.fail(why)
	if ready {
		log.L(ctx).Warn("sandbox fenced: its init exited while it was ready; destroying it", attrs...)
		p.poke()
		m.destroy(ctx, sb)
		return
	}
	log.L(ctx).Warn("sandbox fenced: its init exited; calls on it fail until it is released and destroyed", attrs...)
}

// removeReady takes sb out of p's ready list; false when it is not there.
func removeReady(p *pool, sb *sandbox) bool {
	for i, r := range p.ready {
		if r == sb {
			p.ready = append(p.ready[:i], p.ready[i+1:]...)
			return true
		}
	}
	return false
}

// killForRelease kills every process of sb but its init through the cgroup and checks that
// the init is still the one the sandbox started with and still serves its socket (a relay
// left in place of the socket, or an init that exited, makes the sandbox unusable).
func (m *Manager) killForRelease(ctx context.Context, sb *sandbox) error {
	ref := sb.inst.ref.Load()
	if err := ref.usable(); err != nil {
		return err
	}
	frz := NewFreezer(sb.inst.layout.Cgroup)
	if _, err := frz.KillAllBut(ctx, int(ref.pid), releaseKillTimeout); err != nil {
		return fmt.Errorf("kill sandbox processes: %w", err)
	}
	if err := ref.usable(); err != nil {
		return err
	}
	if _, err := sb.inst.init.Ping(ctx); err != nil {
		return fmt.Errorf("sandbox init after release: %w", err)
	}
	return nil
}

// FDPath names an open file for APIs that take a path: /proc/self/fd/N opens exactly the
// file f holds (valid while f is open).
func FDPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }
