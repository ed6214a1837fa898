package proxy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/internal/log"
)

// Compaction: a journal only grows while its sandbox is leased, and most of it is the bodies
// of requests that were sent or dropped long ago, which nothing reads again (the API shows an
// effect's method, URL and status, never its body). When those bodies are at least half of a
// journal of compactMin bytes or more, Commit and Rollback rewrite it: every effect keeps its
// record and status, an effect that is done loses its request body and headers (and its
// compensating request unless a rollback may still send it), and held or sending effects stay
// whole. A damaged journal is never compacted: its bytes are the evidence. The new file is written beside the old one, synced and renamed over it, so a crash
// leaves one or the other.

// compactMin is the journal size below which compaction is not worth a rewrite.
var compactMin int64 = 8 << 20

// done reports whether an effect's request will never be sent again; keepCompensation
// whether its compensating request may still be (a rollback to before it).
func done(st *effectState) (finished, keepCompensation bool) {
	switch st.Status {
	case StatusHeld, StatusSending:
		return false, true
	case StatusPassed:
		return true, st.compensation
	}
	return true, false
}

// reclaimable returns the bytes held by the records of finished effects not compacted yet.
// Callers hold j.mu.
func (j *journal) reclaimable() int64 {
	var n int64
	for _, st := range j.effects {
		if finished, _ := done(st); finished && !st.compacted {
			n += st.size
		}
	}
	return n
}

// maybeCompact compacts the journal when it is worth it. Callers hold j.op or j.send; the
// other may be running: it reads effects by ID under j.mu (load), so the moved offsets are
// never read stale; new effects wait on j.mu for the rewrite, and an
// fsync in flight (syncMu, taken first as syncTo does) finishes on the old file before it is
// closed.
func (j *journal) maybeCompact(ctx context.Context) {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	before := j.size
	if j.f == nil || j.err != nil || len(j.damaged) > 0 || before < compactMin || 2*j.reclaimable() < before {
		return
	}
	if err := j.compact(); err != nil {
		log.L(ctx).Warn("journal: compaction failed; the journal stays as it is", "path", j.path, "error", err)
		return
	}
	log.L(ctx).Info("journal compacted", "path", j.path, "bytes_before", before, "bytes_after", j.size)
}

// compact rewrites the journal as described above. Callers hold j.mu.
func (j *journal) compact() error {
	if j.f == nil {
		return fmt.Errorf("journal %s is closed: %w", j.path, errdefs.ErrNotFound)
	}
	data, err := j.compacted()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(j.path), ".compact-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write compacted journal: %w", err)
	}
	fresh := &journal{path: j.path, byID: map[string]*effectState{}}
	if good, dmg := fresh.replay(data); good != int64(len(data)) || len(dmg) > 0 || len(fresh.effects) != len(j.effects) || fresh.seq != j.seq {
		return fmt.Errorf("compacted journal %s does not replay to the same effects: %w", j.path, errdefs.ErrDataLoss)
	}
	if err := os.Rename(tmp.Name(), j.path); err != nil {
		return fmt.Errorf("replace journal: %w", err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(j.path)); err != nil {
		// The rename may or may not survive a crash; either file is a whole journal.
		return fmt.Errorf("sync journal dir: %w", err)
	}
	f, err := os.OpenFile(j.path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		j.err = fmt.Errorf("reopen compacted journal %s: %w: %w", j.path, errdefs.ErrUnavailable, err)
		return j.err
	}
	j.f.Close()
	j.f, j.size = f, int64(len(data))
	j.effects, j.byID = fresh.effects, fresh.byID
	j.synced.Store(j.written) // everything is on disk
	return nil
}

// compacted returns the compacted journal's content. Callers hold j.mu.
func (j *journal) compacted() ([]byte, error) {
	var out []byte
	add := func(r *record) error {
		buf, err := encodeRecord(r)
		out = append(out, buf...)
		return err
	}
	for _, st := range j.effects {
		se, err := readEffect(j.f, st)
		if err != nil {
			return nil, err
		}
		if finished, keepComp := done(st); finished {
			se.Request.Body, se.Request.Header, se.Compacted = nil, nil, true
			if !keepComp {
				se.Compensation = nil
			}
		}
		if err := add(&record{Type: recEffect, Effect: se}); err != nil {
			return nil, err
		}
		for i := range st.History {
			if err := add(&record{Type: recAttempt, ID: st.ID, Attempt: &st.History[i]}); err != nil {
				return nil, err
			}
		}
		if err := add(&record{Type: recStatus, ID: st.ID, Status: st.Status, ResponseStatus: st.ResponseStatus,
			Attempts: st.Attempts, Error: st.Error}); err != nil {
			return nil, err
		}
	}
	if j.committed > 0 {
		if err := add(&record{Type: recCommit, Upto: j.committed}); err != nil {
			return nil, err
		}
		if err := add(&record{Type: recCommitDone, Upto: j.committed}); err != nil {
			return nil, err
		}
	}
	if j.ckpt != "" {
		if err := add(&record{Type: recCheckpoint, Checkpoint: j.ckpt}); err != nil {
			return nil, err
		}
	}
	if j.pending > 0 {
		if err := add(&record{Type: recCommit, Upto: j.pending}); err != nil {
			return nil, err
		}
	}
	return out, nil
}
