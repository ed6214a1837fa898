//go:build linux

package initd

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the only code in the init that waits for children. It reaps every exited child
// with wait4(-1) and hands the status of the ones an exec is waiting for to that exec, so
// the PID-1 duty (reap orphans) never steals an exec's exit status. Starting a tracked child
// holds the same lock as reaping, so a child cannot be reaped before it is registered.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
	orphans int // untracked children reaped, for diagnostics
}

func newReaper() *reaper {
	return &reaper{waiting: make(map[int]chan unix.WaitStatus)}
}

// start runs fork (which must create exactly one child and return its pid) under the reap
// lock and registers the child. The returned channel receives its wait status once.
func (r *reaper) start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	return pid, ch, nil
}

// adopt registers a child the init had before it executed itself again (reexec_linux.go);
// it must be called before the reaper runs. The returned channel receives its wait status.
func (r *reaper) adopt(pid int) <-chan unix.WaitStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	return ch
}

// reapAll collects every exited child without blocking.
func (r *reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ch, ok := r.waiting[pid]; ok {
			ch <- ws
			delete(r.waiting, pid)
			continue
		}
		r.orphans++
	}
}

// run reaps on every SIGCHLD (and once a second as a safety net) until ctx ends.
func (r *reaper) run(ctx context.Context) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGCHLD)
	defer signal.Stop(sig)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-sig:
		case <-tick.C:
		}
	}
}
