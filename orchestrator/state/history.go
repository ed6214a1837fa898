package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/containerd/errdefs"
)

// item is one point of the live history: an applied op, or a rollback marker (entry nil).
type item struct {
	seq   uint64
	entry *Entry
}

// history is the live, linear history after the compaction point: exactly the points a
// rollback can return to. Ops undone by a rollback, and markers behind it, leave it.
type history struct {
	base  uint64 // compaction point: the oldest state that can still be reached
	items []item // ascending seq, all > base
}

// last is the current sequence number.
func (h *history) last() uint64 {
	if len(h.items) == 0 {
		return h.base
	}
	return h.items[len(h.items)-1].seq
}

// cut returns the index of the first item after seq and whether seq is a point of the history.
func (h *history) cut(seq uint64) (int, bool) {
	i := sort.Search(len(h.items), func(i int) bool { return h.items[i].seq > seq })
	return i, seq == h.base || (i > 0 && h.items[i-1].seq == seq)
}

// core is the document with its history: what the store serves and what replay rebuilds.
type core struct {
	doc  *document
	hist history
}

// undoItems applies the inverses of items newest first and returns how many ops it undid. If
// an inverse fails, the ops already undone are re-applied, leaving the document unchanged.
func (c *core) undoItems(items []item) (int, error) {
	n := 0
	for j := len(items) - 1; j >= 0; j-- {
		e := items[j].entry
		if e == nil {
			continue
		}
		if err := c.doc.applyList(e.Inverse); err != nil {
			if rerr := c.redoItems(items[j+1:]); rerr != nil {
				return 0, fmt.Errorf("undo seq %d: %v; redo: %v: %w", e.Seq, err, rerr, errdefs.ErrInternal)
			}
			return 0, fmt.Errorf("undo seq %d: %v: %w", e.Seq, err, errdefs.ErrInternal)
		}
		n++
	}
	return n, nil
}

// redoItems re-applies the ops of items in order.
func (c *core) redoItems(items []item) error {
	for _, it := range items {
		if it.entry == nil {
			continue
		}
		if err := c.doc.applyList([]Op{it.entry.Op}); err != nil {
			return fmt.Errorf("redo seq %d: %w", it.seq, err)
		}
	}
	return nil
}

// rebuilt is the state as the directory holds it.
type rebuilt struct {
	core
	snapSeq uint64 // seq of the snapshot replay started from
	valid   int    // length of the log's intact prefix
	logLen  int    // length of the log file
}

// rebuild loads dir's snapshot and replays the log records after it. It does not modify dir.
func rebuild(dir string, maxDepth int) (*rebuilt, error) {
	snapSeq, root, err := readSnapshot(dir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, logName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read state log: %w", err)
	}
	recs, valid, err := scanLog(data)
	if err != nil {
		return nil, err
	}
	doc, err := newDocument(root)
	if err != nil {
		return nil, err
	}
	doc.maxDepth = maxDepth
	r := &rebuilt{core: core{doc: doc}, snapSeq: snapSeq, valid: valid, logLen: len(data)}
	for i, rec := range recs {
		if err := r.replay(rec, i == 0); err != nil {
			return nil, fmt.Errorf("replay state log record %d (%s): %v: %w", i, rec.Type, err, errdefs.ErrDataLoss)
		}
	}
	if r.snapSeq < r.hist.base || r.snapSeq > r.hist.last() {
		return nil, fmt.Errorf("snapshot at seq %d does not fit the log (seq %d to %d): %w",
			r.snapSeq, r.hist.base, r.hist.last(), errdefs.ErrDataLoss)
	}
	return r, nil
}

// replay applies one log record. Ops at or before the snapshot are already in the document
// and only join the history.
func (r *rebuilt) replay(rec record, first bool) error {
	switch rec.Type {
	case recBase:
		if !first {
			return errors.New("base record in the middle of the log")
		}
		r.hist.base = rec.Seq
		return nil
	case recPatch:
		return r.replayPatch(rec.Entries)
	case recRollback:
		return r.replayRollback(rec)
	}
	return fmt.Errorf("unknown record type %q", rec.Type)
}

func (r *rebuilt) replayPatch(entries []Entry) error {
	for i := range entries {
		e := &entries[i]
		if e.Seq <= r.hist.last() {
			return fmt.Errorf("seq %d does not follow %d", e.Seq, r.hist.last())
		}
		if e.Seq > r.snapSeq {
			if err := r.replayOp(e.Op); err != nil {
				return fmt.Errorf("seq %d: %w", e.Seq, err)
			}
		}
		r.hist.items = append(r.hist.items, item{seq: e.Seq, entry: e})
	}
	return nil
}

// replayOp applies one logged op within the depth limit: a log written without it (or with
// a larger one) is refused rather than rebuilt into a document too deep to walk.
func (r *rebuilt) replayOp(o Op) error {
	c, err := compileOp(o, 0)
	if err != nil {
		return err
	}
	if err := r.doc.checkDepth(c); err != nil {
		return err
	}
	_, err = r.doc.applyOp(c)
	return err
}

func (r *rebuilt) replayRollback(rec record) error {
	if rec.Seq <= r.hist.last() {
		return fmt.Errorf("seq %d does not follow %d", rec.Seq, r.hist.last())
	}
	i, ok := r.hist.cut(rec.To)
	if !ok {
		return fmt.Errorf("rollback target %d is not in the history", rec.To)
	}
	if rec.Seq > r.snapSeq {
		if _, err := r.undoItems(r.hist.items[i:]); err != nil {
			return err
		}
	}
	r.hist.items = append(r.hist.items[:i], item{seq: rec.Seq})
	return nil
}
