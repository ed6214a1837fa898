package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// Defaults for the options.
const (
	DefaultSnapshotEvery   = 1000
	DefaultMaxDocumentSize = 16 << 20
	DefaultMaxValueSize    = 1 << 20
	DefaultMaxOpsPerPatch  = 1000
)

type options struct {
	snapshotEvery int
	maxDocSize    int64
	maxValueSize  int
	maxOps        int
	maxDepth      int
}

// Option configures Open.
type Option func(*options)

// WithSnapshotEvery writes a full snapshot in the background once n ops (and rollback
// markers) have been logged since the last one, bounding replay on Open. 0 disables it.
func WithSnapshotEvery(n int) Option { return func(o *options) { o.snapshotEvery = n } }

// WithMaxDocumentSize limits the document's canonical JSON encoding to n bytes.
func WithMaxDocumentSize(n int64) Option { return func(o *options) { o.maxDocSize = n } }

// WithMaxValueSize limits the raw "value" of a single op to n bytes.
func WithMaxValueSize(n int) Option { return func(o *options) { o.maxValueSize = n } }

// WithMaxOpsPerPatch limits the number of ops in one patch.
func WithMaxOpsPerPatch(n int) Option { return func(o *options) { o.maxOps = n } }

// Store is one sandbox's state document and op log. It is safe for concurrent use.
type Store struct {
	dir  string
	opts options
	ctx  context.Context // for background logging only
	lock *os.File        // holds the directory's flock

	snapMu   sync.Mutex // serializes Snapshot and Compact
	mu       sync.RWMutex
	core             // guarded by mu
	log      logFile // guarded by mu (writes); the committer syncs it
	logLen   int64   // guarded by mu
	buf      []byte  // guarded by mu: frame buffer
	closed   bool    // guarded by mu
	failed   error   // guarded by mu: set when memory or log can no longer be trusted
	inflight sync.WaitGroup

	commit     committer
	snapSeq    atomic.Uint64 // seq of the newest snapshot on disk
	bgRunning  atomic.Bool
	background sync.WaitGroup
}

// Open opens (creating if needed) the state directory dir and rebuilds the document from its
// snapshot and log. A torn record at the end of the log (a crash during a write) is cut off
// and logged; damage anywhere else fails with errdefs.ErrDataLoss. A directory is open in at
// most one Store at a time (flock); a second Open fails with errdefs.ErrUnavailable.
func Open(ctx context.Context, dir string, opts ...Option) (*Store, error) {
	o := options{snapshotEvery: DefaultSnapshotEvery, maxDocSize: DefaultMaxDocumentSize,
		maxValueSize: DefaultMaxValueSize, maxOps: DefaultMaxOpsPerPatch, maxDepth: DefaultMaxDepth}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if err := checkLogPresent(dir); err != nil {
		return nil, fmt.Errorf("open state %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s, err := openLocked(ctx, dir, o)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("open state %s: %w", dir, err)
	}
	s.lock = lock
	return s, nil
}

func openLocked(ctx context.Context, dir string, o options) (*Store, error) {
	r, err := rebuild(dir, o.maxDepth)
	if err != nil {
		return nil, err
	}
	l, err := openLog(filepath.Join(dir, logName))
	if err != nil {
		return nil, err
	}
	if err := cutTornTail(ctx, l, r); err != nil {
		l.Close()
		return nil, err
	}
	if err := syncDir(dir); err != nil {
		l.Close()
		return nil, err
	}
	r.doc.maxSize = o.maxDocSize
	s := &Store{dir: dir, opts: o, ctx: context.WithoutCancel(ctx), core: r.core, log: l, logLen: int64(r.valid)}
	s.commit.f = l
	s.snapSeq.Store(r.snapSeq)
	log.L(ctx).Debug("state opened", "dir", dir, "seq", s.hist.last(), "base", s.hist.base, "snapshot", r.snapSeq)
	return s, nil
}

// cutTornTail truncates the log to its intact prefix, durably.
func cutTornTail(ctx context.Context, l logFile, r *rebuilt) error {
	if r.valid == r.logLen {
		return nil
	}
	log.L(ctx).Warn("state log has a torn final record, truncating it",
		"valid_bytes", r.valid, "dropped_bytes", r.logLen-r.valid)
	if err := l.Truncate(int64(r.valid)); err != nil {
		return fmt.Errorf("truncate torn state log: %w", err)
	}
	return l.Sync()
}

// checkLogPresent refuses a state dir that was opened before (it has its LOCK file) but has
// lost its log: that is not a new store, and opening it would serve an empty (or only the
// snapshot's) document. A new store's log is created before its LOCK file, so a crash
// between the two leaves a log without a LOCK, which is fine.
func checkLogPresent(dir string) error {
	_, lerr := os.Stat(filepath.Join(dir, "LOCK"))
	_, err := os.Stat(filepath.Join(dir, logName))
	switch {
	case lerr == nil && errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("the state log %s is missing from a store that was used before: %w", logName, errdefs.ErrDataLoss)
	case errors.Is(lerr, os.ErrNotExist) && errors.Is(err, os.ErrNotExist):
		l, err := openLog(filepath.Join(dir, logName))
		if err != nil {
			return err
		}
		if err := errors.Join(l.Sync(), l.Close()); err != nil {
			return fmt.Errorf("create state log: %w", err)
		}
		return syncDir(dir)
	}
	return nil
}

func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open state lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state dir %s is open in another store: %w", dir, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("lock state dir %s: %w", dir, err)
	}
	return f, nil
}

// Close waits for in-flight calls, syncs the log and releases the directory. Later calls
// fail with errdefs.ErrFailedPrecondition.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.background.Wait()
	err := s.commit.wait(s.commit.written.Load())
	err = errors.Join(err, s.log.Close(), s.lock.Close())
	if err != nil {
		return fmt.Errorf("close state %s: %w", s.dir, err)
	}
	return nil
}

// usable reports why the store cannot serve calls; mu must be held.
func (s *Store) usable() error {
	if s.closed {
		return fmt.Errorf("state store is closed: %w", errdefs.ErrFailedPrecondition)
	}
	return s.failed
}

// begin registers a writing call; mu must be held for writing. The caller ends it with
// s.inflight.Done().
func (s *Store) begin() error {
	if err := s.usable(); err != nil {
		return err
	}
	s.inflight.Add(1)
	return nil
}

// fail makes the store refuse all further calls; reopening rebuilds it from disk.
func (s *Store) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = fmt.Errorf("state store failed, reopen it: %w", err)
		log.L(s.ctx).Error("state store failed", "dir", s.dir, "error", err)
	}
}

// Seq returns the current sequence number: that of the newest op or rollback in the history.
func (s *Store) Seq() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hist.last()
}

// Get returns the canonical JSON (compact, sorted keys) of the value at the RFC 6901 pointer
// p; "" is the whole document. A malformed pointer wraps errdefs.ErrInvalidArgument, one that
// names no value errdefs.ErrNotFound.
func (s *Store) Get(p string) (json.RawMessage, error) {
	ptr, err := parsePointer(p)
	if err != nil {
		return nil, fmt.Errorf("get: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	return s.doc.getJSON(p, ptr)
}

// getJSON encodes the value at ptr (p, as the caller wrote it): errdefs.ErrNotFound when ptr
// names no value, errdefs.ErrInvalidArgument when it cannot name one (a bad array index, say).
func (d *document) getJSON(p string, ptr pointer) (json.RawMessage, error) {
	v, err := d.get(ptr)
	if errors.Is(err, errPathNotFound) {
		return nil, fmt.Errorf("get %q: %w", p, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %q: %w: %w", p, err, errdefs.ErrInvalidArgument)
	}
	return encode(v)
}

// write appends rec to the log and returns the position to wait for; mu must be held. On a
// write error nothing of rec stays in the log.
func (s *Store) write(rec record) (uint64, error) {
	buf, err := appendFrame(s.buf[:0], rec)
	if err != nil {
		return 0, err
	}
	s.buf = buf[:0]
	n, err := s.log.Write(buf)
	if err != nil {
		if n > 0 {
			if terr := s.log.Truncate(s.logLen); terr != nil {
				s.failed = fmt.Errorf("cut partial log record: %v: %w", terr, errdefs.ErrUnavailable)
			}
		}
		return 0, fmt.Errorf("write state log: %w", err)
	}
	s.logLen += int64(len(buf))
	return s.commit.written.Add(uint64(len(buf))), nil
}

// durable waits until pos is on disk and fails the store if it cannot be.
func (s *Store) durable(pos uint64) error {
	if err := s.commit.wait(pos); err != nil {
		s.fail(err)
		return err
	}
	return nil
}
