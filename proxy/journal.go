package proxy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// A journal file is a sequence of records, each framed as
//
//	uint32 little-endian payload length | uint32 CRC-32C of the payload | JSON payload
//
// appended, and rewritten only by compaction (a new file renamed over the old one). A record
// that is short or fails its checksum is a torn tail from a crash: it and everything after it
// are cut off when the journal is opened.

const (
	frameHeader = 8
	maxRecord   = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record types.
const (
	recEffect     = "effect"
	recStatus     = "status"
	recCheckpoint = "checkpoint"
	recCommit     = "commit"
	recCommitDone = "commit_done"
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
	limit int64      // bytes; effect records beyond it are refused
	op    sync.Mutex // serializes Commit and Rollback of the sandbox

	mu      sync.Mutex
	f       *os.File
	size    int64
	err     error // sticky: set when an fsync failed
	written uint64
	seq     uint64
	ckpt    string
	effects []*effectState
	byID    map[string]*effectState
	pending uint64 // upto of an unfinished commit, 0 if none

	syncMu sync.Mutex
	synced atomic.Uint64
}

// openJournal opens (or creates) a journal and replays it, cutting off a torn tail.
func openJournal(ctx context.Context, path string) (*journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	j := &journal{path: path, f: f, byID: map[string]*effectState{}}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read journal %s: %w", path, err)
	}
	good := j.replay(data)
	if good < int64(len(data)) {
		log.L(ctx).Warn("journal: dropping torn tail", "path", path, "offset", good, "bytes", int64(len(data))-good)
		if err := truncateSync(f, good); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate torn journal %s: %w", path, err)
		}
	}
	j.size = good
	return j, nil
}

func truncateSync(f *os.File, size int64) error {
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// replay applies every whole record of data and returns the offset after the last one.
func (j *journal) replay(data []byte) int64 {
	var off int64
	for {
		rec, n, ok := decodeRecord(data[off:])
		if !ok {
			return off
		}
		j.apply(rec, off, int64(n))
		off += int64(n)
	}
}

func encodeRecord(r *record) ([]byte, error) {
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode journal record: %w", err)
	}
	if len(payload) > maxRecord {
		return nil, fmt.Errorf("journal record of %d bytes: %w", len(payload), errdefs.ErrResourceExhausted)
	}
	buf := make([]byte, frameHeader, frameHeader+len(payload))
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

// decodeRecord decodes the record at the start of data; ok is false for a short, corrupt or
// undecodable record.
func decodeRecord(data []byte) (rec *record, n int, ok bool) {
	if len(data) < frameHeader {
		return nil, 0, false
	}
	size := int(binary.LittleEndian.Uint32(data[0:4]))
	if size > maxRecord || len(data) < frameHeader+size {
		return nil, 0, false
	}
	payload := data[frameHeader : frameHeader+size]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(data[4:8]) {
		return nil, 0, false
	}
	rec = &record{}
	if err := json.Unmarshal(payload, rec); err != nil || rec.Type == "" {
		return nil, 0, false
	}
	return rec, frameHeader + size, true
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
		j.pending = r.Upto
	case recCommitDone:
		j.pending = 0
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
}

func (e *storedEffect) public() Effect {
	return Effect{
		ID: e.ID, Seq: e.Seq, Checkpoint: e.Checkpoint, Method: e.Request.Method, URL: e.Request.URL,
		Status: e.Status, ResponseStatus: e.ResponseStatus, Created: e.Created,
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
		_ = j.f.Truncate(j.size) // do not leave a partial record in front of later ones
		return 0, fmt.Errorf("write journal %s: %w: %w", j.path, errdefs.ErrUnavailable, err)
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

// load reads the full journaled form of an effect back from disk.
func (j *journal) load(st *effectState) (*storedEffect, error) {
	j.mu.Lock()
	f := j.f
	j.mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("journal %s is closed: %w", j.path, errdefs.ErrNotFound)
	}
	return readEffect(f, st)
}

// readEffect reads the effect record of st from f.
func readEffect(f *os.File, st *effectState) (*storedEffect, error) {
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
