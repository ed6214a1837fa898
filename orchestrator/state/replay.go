package state

import (
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
)

// Doc is a document outside a store, for replaying recorded ops and their inverses (the
// orchestrator rebuilds the document of a checkpoint on another branch of its tree with it).
type Doc struct{ d *document }

// NewDoc decodes doc (JSON; empty means null).
func NewDoc(doc json.RawMessage) (*Doc, error) {
	if len(doc) == 0 {
		doc = json.RawMessage("null")
	}
	root, err := decodeValue(doc)
	if err != nil {
		return nil, fmt.Errorf("decode document: %w", err)
	}
	d, err := newDocument(root)
	if err != nil {
		return nil, err
	}
	d.maxDepth = DefaultMaxDepth
	return &Doc{d: d}, nil
}

// Apply applies ops in order.
func (d *Doc) Apply(ops []Op) error { return d.d.applyList(ops) }

// Undo applies the inverses of entries, newest first.
func (d *Doc) Undo(entries []Entry) error {
	for i := len(entries) - 1; i >= 0; i-- {
		if err := d.d.applyList(entries[i].Inverse); err != nil {
			return fmt.Errorf("undo seq %d: %w", entries[i].Seq, err)
		}
	}
	return nil
}

// Redo applies the ops of entries, oldest first.
func (d *Doc) Redo(entries []Entry) error {
	for _, e := range entries {
		if err := d.d.applyList([]Op{e.Op}); err != nil {
			return fmt.Errorf("redo seq %d: %w", e.Seq, err)
		}
	}
	return nil
}

// JSON returns the document's canonical encoding.
func (d *Doc) JSON() (json.RawMessage, error) { return encode(d.d.root) }

// Has reports whether seq is a point of the current history: the compaction base, or an op or
// rollback marker that was not rolled back (a RollbackTo target).
func (s *Store) Has(seq uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if seq < s.hist.base {
		return false
	}
	_, ok := s.hist.cut(seq)
	return ok
}

// Get returns the canonical JSON of the value at pointer p ("" is the whole document).
func (d *Doc) Get(p string) (json.RawMessage, error) {
	ptr, err := parsePointer(p)
	if err != nil {
		return nil, fmt.Errorf("get: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return d.d.getJSON(p, ptr)
}
