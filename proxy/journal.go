package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/log"
)

// Record types.
const (
	recEffect     = "effect"
	recStatus     = "status"
	recCheckpoint = "checkpoint"
	recCommit     = "commit"
	recCommitDone = "commit_done"
	recDamage     = "damage"  // the journal is known to lack records up to Upto (Error says why)
	recAttempt    = "attempt" // one delivery attempt of effect ID and its outcome
)

type record struct {
	Type           string        `json:"t"`
	Effect         *storedEffect `json:"e,omitempty"`
	ID             string        `json:"id,omitempty"`
	Status         Status        `json:"s,omitempty"`
	ResponseStatus int           `json:"rs,omitempty"`
	Attempts       int           `json:"a,omitempty"`
	Error          string        `json:"err,omitempty"`
	Checkpoint     string        `json:"c,omitempty"`
	Upto           uint64        `json:"u,omitempty"`
	Attempt        *Attempt      `json:"at,omitempty"`
}

// storedRequest is a request as journaled: everything needed to send it later.
type storedRequest struct {
	Method       string      `json:"method"`
	URL          string      `json:"url"`
	Header       http.Header `json:"header,omitempty"`
	Body         []byte      `json:"body,omitempty"`
	AllowPrivate bool        `json:"allow_private,omitempty"`
}

// storedEffect is the full journaled form of an effect.
type storedEffect struct {
	ID             string         `json:"id"`
	Seq            uint64         `json:"seq"`
	Checkpoint     string         `json:"checkpoint,omitempty"`
	Status         Status         `json:"status"`
	Created        time.Time      `json:"created"`
	Request        storedRequest  `json:"request"`
	ResponseStatus int            `json:"response_status,omitempty"`
	Compensation   *storedRequest `json:"compensation,omitempty"`
	CompensateErr  string         `json:"compensate_error,omitempty"`
	Compacted      bool           `json:"compacted,omitempty"` // request body and headers dropped
	Reason         string         `json:"reason,omitempty"`    // why a denied request was refused
}

// effectState is the in-memory index entry of an effect; bodies stay on disk at off.
type effectState struct {
	Effect
	off          int64
	size         int64 // of its effect record
	compensation bool  // has a compensating request (or an error rendering it)
	compacted    bool
}

// journal is one sandbox's effect journal.
type journal struct {
	path  string
	limit int64              // bytes; effect records beyond it are refused
	op    sync.Mutex         // serializes rollbacks of the sandbox (and its removal)
	send  sync.Mutex         // serializes commits, retries and resumed commits (and removal)
	stop  context.CancelFunc // cancels the send in progress (under mu), for RemoveSandbox

	mu        sync.Mutex
	f         journalFile
	size      int64
	err       error  // sticky: set when an fsync failed or a partial record could not be cut off
	damaged   []span // bytes that do not decode, with intact records after them (journal_scan.go)
	missing   string // why the journal is known to lack records (ExpectWatermark), "" if not
	written   uint64
	seq       uint64
	ckpt      string
	effects   []*effectState
	byID      map[string]*effectState
	pending   uint64 // upto of an unfinished commit, 0 if none
	committed uint64 // the highest upto any commit began with

	syncMu sync.Mutex
	synced atomic.Uint64
}

// journalFile is the journal's open file; tests substitute failing ones.
type journalFile interface {
	io.ReaderAt
	Write(p []byte) (int, error)
	Truncate(size int64) error
	Sync() error
	Close() error
}

// openJournal opens (or creates, durably) a journal and replays it, cutting off a torn tail
// and marking damage (journal_scan.go).
func openJournal(ctx context.Context, path string) (*journal, error) {
	f, err := openJournalFile(path)
	if err != nil {
		return nil, err
	}
	j := &journal{path: path, f: f, byID: map[string]*effectState{}}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read journal %s: %w", path, err)
	}
	good, dmg := j.replay(data)
	if good < int64(len(data)) {
		log.L(ctx).Warn("journal: dropping torn tail", "path", path, "offset", good, "bytes", int64(len(data))-good)
		if err := truncateSync(f, good); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate torn journal %s: %w", path, err)
		}
	}
	j.size, j.damaged = good, dmg
	if err := j.damageError(); err != nil {
		log.L(ctx).Error("journal: damaged; its sandbox's commits are refused", "path", path, "error", err)
	}
	return j, nil
}

// openJournalFile opens a journal file for appending; a new one's directory entry is synced
// before anything is appended, so that a synced record cannot vanish with its file.
func openJournalFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err == nil {
		if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
			f.Close()
			return nil, fmt.Errorf("sync journal dir: %w", err)
		}
		return f, nil
	}
	if !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	if f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o600); err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return f, nil
}

func truncateSync(f journalFile, size int64) error {
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// apply updates the in-memory index with a record of size bytes written at off. Callers hold
// j.mu (or own j).
func (j *journal) apply(r *record, off, size int64) {
	switch r.Type {
	case recEffect:
		if r.Effect == nil {
			return
		}
		st := &effectState{Effect: r.Effect.public(), off: off, size: size, compacted: r.Effect.Compacted}
		st.compensation = r.Effect.Compensation != nil || r.Effect.CompensateErr != ""
		j.effects = append(j.effects, st)
		j.byID[st.ID] = st
		j.seq = max(j.seq, st.Seq)
	case recStatus:
		j.applyStatus(r)
	case recCheckpoint:
		j.ckpt = r.Checkpoint
	case recCommit:
		j.pending, j.committed = r.Upto, max(j.committed, r.Upto)
	case recCommitDone:
		j.pending = 0
	case recDamage:
		j.missing, j.seq = r.Error, max(j.seq, r.Upto)
	case recAttempt:
		if st := j.byID[r.ID]; st != nil && r.Attempt != nil {
			st.History = append(slices.Clip(st.History), *r.Attempt) // snapshots share the old array
			st.Attempts++
		}
	}
}

func (j *journal) applyStatus(r *record) {
	st := j.byID[r.ID]
	if st == nil {
		return
	}
	st.Status = r.Status
	if r.ResponseStatus != 0 {
		st.ResponseStatus = r.ResponseStatus
	}
	if r.Attempts != 0 {
		st.Attempts = r.Attempts
	}
	st.Error = r.Error
	st.NextAttempt = nil
}

func (e *storedEffect) public() Effect {
	return Effect{
		ID: e.ID, Seq: e.Seq, Checkpoint: e.Checkpoint, Method: e.Request.Method, URL: e.Request.URL,
		Status: e.Status, ResponseStatus: e.ResponseStatus, Created: e.Created, Error: e.Reason,
	}
}

// append writes r (assigning the next sequence number and the current checkpoint to an
// effect) and, if durable, returns only once it is on disk. Concurrent durable appends share
// fsyncs (group commit).
func (j *journal) append(r *record, durable bool) error {
	ticket, err := j.write(r)
	if err != nil || !durable {
		return err
	}
	return j.syncTo(ticket)
}

func (j *journal) write(r *record) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.writeLocked(r)
}

// writeLocked is write with j.mu held.
func (j *journal) writeLocked(r *record) (uint64, error) {
	if j.err != nil {
		return 0, j.err
	}
	if j.f == nil {
		return 0, fmt.Errorf("journal %s is closed: %w", j.path, errdefs.ErrNotFound)
	}
	if r.Type == recEffect {
		r.Effect.Seq, r.Effect.Checkpoint = j.seq+1, j.ckpt
	}
	buf, err := encodeRecord(r)
	if err != nil {
		return 0, err
	}
	if r.Type == recEffect && j.limit > 0 && j.size+int64(len(buf)) > j.limit {
		return 0, fmt.Errorf("journal %s is full (%d bytes): %w", j.path, j.limit, errdefs.ErrResourceExhausted)
	}
	if _, err := j.f.Write(buf); err != nil {
		err = fmt.Errorf("write journal %s: %w: %w", j.path, errdefs.ErrUnavailable, err)
		if terr := j.f.Truncate(j.size); terr != nil {
			// A partial record may stay in front of later ones: append nothing more.
			j.err = fmt.Errorf("%w; cutting off the partial record failed too, the journal takes no more records: %w", err, terr)
			return 0, j.err
		}
		return 0, err
	}
	j.apply(r, j.size, int64(len(buf)))
	j.size += int64(len(buf))
	j.written++
	return j.written, nil
}

// syncTo returns once every record up to ticket is on disk; one fsync covers all records
// written before it started.
func (j *journal) syncTo(ticket uint64) error {
	if j.synced.Load() >= ticket {
		return nil
	}
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced.Load() >= ticket {
		return nil
	}
	j.mu.Lock()
	target, f, err := j.written, j.f, j.err
	j.mu.Unlock()
	if err == nil && f != nil {
		err = f.Sync()
	}
	if err != nil {
		j.mu.Lock()
		j.err = fmt.Errorf("fsync journal %s: %w: %w", j.path, errdefs.ErrUnavailable, err)
		err = j.err
		j.mu.Unlock()
		return err
	}
	j.synced.Store(target)
	return nil
}

// load reads the full journaled form of an effect back from disk, at its current offset (a
// compaction may have moved it since st was copied).
func (j *journal) load(st *effectState) (*storedEffect, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil, fmt.Errorf("journal %s is closed: %w", j.path, errdefs.ErrNotFound)
	}
	cur := j.byID[st.ID]
	if cur == nil {
		return nil, fmt.Errorf("effect %s: %w", st.ID, errdefs.ErrNotFound)
	}
	return readEffect(j.f, cur)
}

// transition appends r (a status record of r.ID) only if the effect's status is one of from,
// checked and written under one lock, so that a commit and a rollback never both take an
// effect; an effect already in r's status is taken without a record. It reports whether the
// effect was taken; with durable, the record is on disk when it returns.
func (j *journal) transition(r *record, durable bool, from ...Status) (bool, error) {
	j.mu.Lock()
	st := j.byID[r.ID]
	if st == nil || !slices.Contains(from, st.Status) {
		j.mu.Unlock()
		return false, nil
	}
	if st.Status == r.Status {
		j.mu.Unlock()
		return true, nil
	}
	ticket, err := j.writeLocked(r)
	j.mu.Unlock()
	if err != nil || !durable {
		return err == nil, err
	}
	return true, j.syncTo(ticket)
}

// sending returns ctx for a send of the journal's effects, which RemoveSandbox cancels.
// Callers hold j.send and call done when the send ends.
func (j *journal) sending(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	j.mu.Lock()
	j.stop = cancel
	j.mu.Unlock()
	return ctx, func() {
		j.mu.Lock()
		j.stop = nil
		j.mu.Unlock()
		cancel()
	}
}

// cancelSend cancels the send in progress, if any.
func (j *journal) cancelSend() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stop != nil {
		j.stop()
	}
}

// setNext shows when the next attempt of an effect is due (not journaled).
func (j *journal) setNext(id string, at time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if st := j.byID[id]; st != nil {
		st.NextAttempt = &at
	}
}

// readEffect reads the effect record of st from f.
func readEffect(f io.ReaderAt, st *effectState) (*storedEffect, error) {
	var hdr [frameHeader]byte
	if _, err := f.ReadAt(hdr[:], st.off); err != nil {
		return nil, fmt.Errorf("read effect %s: %w", st.ID, err)
	}
	buf := make([]byte, frameHeader+int(binary.LittleEndian.Uint32(hdr[0:4])))
	if _, err := f.ReadAt(buf, st.off); err != nil {
		return nil, fmt.Errorf("read effect %s: %w", st.ID, err)
	}
	rec, _, ok := decodeRecord(buf)
	if !ok || rec.Effect == nil || rec.Effect.ID != st.ID {
		return nil, fmt.Errorf("effect %s: record at %d is corrupt: %w", st.ID, st.off, errdefs.ErrDataLoss)
	}
	return rec.Effect, nil
}

// snapshot returns copies of the effects that keep pred, in sequence order.
func (j *journal) snapshot(pred func(*effectState) bool) []*effectState {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []*effectState
	for _, st := range j.effects {
		if pred(st) {
			c := *st
			c.Suspect = j.suspect(st)
			out = append(out, &c)
		}
	}
	return out
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// flush returns once every record written so far is on disk.
func (j *journal) flush() error {
	j.mu.Lock()
	t := j.written
	j.mu.Unlock()
	return j.syncTo(t)
}

// effect returns the current public view of an effect.
func (j *journal) effect(id string) (Effect, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := j.byID[id]
	if st == nil {
		return Effect{}, fmt.Errorf("effect %s: %w", id, errdefs.ErrNotFound)
	}
	return st.Effect, nil
}
