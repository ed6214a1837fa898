package orchestrator

// The agent-state API: read, patch and the op log of a sandbox's state document (the
// document itself is orchestrator/state's), and their HTTP handlers.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
)

// StateGet returns the sandbox's state document, or the value at pointer.
func (o *Orchestrator) StateGet(ctx context.Context, id, pointer string) (json.RawMessage, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.state.Get(pointer)
}

// StatePatch applies a patch (all ops or none); ifSeq, when set, makes it fail with conflict
// if the document has moved past that sequence number.
func (o *Orchestrator) StatePatch(ctx context.Context, id string, ops []state.Op, ifSeq *uint64) (api.StatePatchResult, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.StatePatchResult{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.pending != nil { // its redo checks that the state did not move
		return api.StatePatchResult{}, fmt.Errorf("sandbox %q has a pending rollback to %s: roll back or checkpoint to finish it: %w",
			id, s.pending.Target, errdefs.ErrFailedPrecondition)
	}
	res, err := s.state.Patch(ctx, ops, state.PatchOptions{IfSeq: ifSeq, Checkpoint: s.latest().ID})
	if err != nil {
		return api.StatePatchResult{}, fmt.Errorf("patch state of %q: %w", id, err)
	}
	return api.StatePatchResult{Seq: res.Seq, Applied: res.Applied}, nil
}

// StateLog returns the logged state ops with from < seq <= to (to == 0: up to now).
func (o *Orchestrator) StateLog(ctx context.Context, id string, from, to uint64) ([]api.StateEntry, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	if to == 0 {
		to = s.state.Seq()
	}
	return s.stateLog(from, to)
}

func (s *session) stateLog(from, to uint64) ([]api.StateEntry, error) {
	entries, err := s.state.Log(from, to)
	if err != nil {
		return nil, err
	}
	out := make([]api.StateEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, stateEntry(e))
	}
	return out, nil
}

func stateEntry(e state.Entry) api.StateEntry {
	se := api.StateEntry{Seq: e.Seq, Checkpoint: e.Checkpoint, Time: e.Time}
	se.Op, _ = json.Marshal(e.Op)
	for _, inv := range e.Inverse {
		data, _ := json.Marshal(inv)
		se.Inverse = append(se.Inverse, data)
	}
	return se
}

func (o *Orchestrator) statePatch(r *http.Request) (any, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxRequestBody))
	if err != nil {
		return nil, fmt.Errorf("read state patch: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	ops, err := state.ParseOps(body)
	if err != nil {
		return nil, err
	}
	var ifSeq *uint64
	if v := r.URL.Query().Get("if_seq"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("if_seq %q: %w", v, errdefs.ErrInvalidArgument)
		}
		ifSeq = &n
	}
	return o.StatePatch(r.Context(), r.PathValue("id"), ops, ifSeq)
}

func (o *Orchestrator) stateLog(r *http.Request) (any, error) {
	q := r.URL.Query()
	from, err1 := parseUint(q.Get("from"))
	to, err2 := parseUint(q.Get("to"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return o.StateLog(r.Context(), r.PathValue("id"), from, to)
}

func parseUint(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a sequence number: %w", s, errdefs.ErrInvalidArgument)
	}
	return n, nil
}
