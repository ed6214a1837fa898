package state

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
)

// committer makes log writes durable with group commit. Writers append under the store's lock
// and advance written (a logical byte count that survives log rewrites); then each waits for
// its own position. The first waiter to get the mutex becomes the leader: it notes how much is
// written, runs one fsync for all of it, and publishes that as durable. Writers that queued
// behind it find their bytes already durable and return without an fsync of their own.
type committer struct {
	written atomic.Uint64 // bytes handed to the log so far
	syncs   atomic.Uint64 // fsyncs run, for tests and metrics

	mu      sync.Mutex // held by the leader for the duration of an fsync
	f       logFile
	durable uint64
	err     error // sticky: after a failed fsync the log's contents are unknown
}

// wait returns once the log is durable up to pos.
func (c *committer) wait(pos uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	if c.durable >= pos {
		return nil
	}
	target := c.written.Load()
	c.syncs.Add(1)
	if err := c.f.Sync(); err != nil {
		c.err = fmt.Errorf("fsync state log: %v: %w", err, errdefs.ErrUnavailable)
		return c.err
	}
	c.durable = target
	return nil
}

// swap installs a new log file whose whole contents are already durable.
func (c *committer) swap(f logFile) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.f = f
	c.durable = c.written.Load()
}
