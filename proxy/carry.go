package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"

	"github.com/containerd/errdefs"
)

// This file carries held effects from one sandbox to another through an L3 snapshot: the
// snapshot of a sandbox holds its held effects in full (ExportHeld), and the sandbox restored
// from it on another node can adopt them (AdoptHeld) under the same effect IDs, so that a
// commit there sends each with the Idempotency-Key it always had. That is how a task that
// moves to another node (pipelines on Temporal, docs/scale-out.md) commits its effects once.

var effectIDRE = regexp.MustCompile(`^eff-[0-9a-f]{24}$`)

// maxCarried bounds how many held effects a snapshot may carry into a sandbox.
const maxCarried = 10000

// ExportHeld returns the full journaled form (requests with their bodies) of the sandbox's
// held effects with seq <= upto (the watermark of the checkpoint the snapshot is of), oldest
// first, as JSON: "[]" when it holds none or has no journal.
func (p *Proxy) ExportHeld(ctx context.Context, sandboxID string, upto uint64) ([]byte, error) {
	out := []*storedEffect{}
	j, err := p.journalFor(ctx, sandboxID, false)
	if errdefs.IsNotFound(err) {
		return json.Marshal(out)
	}
	if err != nil {
		return nil, err
	}
	for _, st := range j.snapshot(func(st *effectState) bool { return st.Status == StatusHeld && st.Seq <= upto }) {
		e, err := j.load(st)
		if err != nil {
			return nil, fmt.Errorf("held effect %s of %s: %w", st.ID, sandboxID, err)
		}
		if e.Compacted {
			return nil, fmt.Errorf("held effect %s of %s lost its request body to a compaction: %w", st.ID, sandboxID, errdefs.ErrFailedPrecondition)
		}
		out = append(out, e)
	}
	return json.Marshal(out)
}

// AdoptHeld journals, durably and in order, the held effects an ExportHeld of another
// sandbox produced as held effects of sandboxID, under their own IDs; effects the journal
// already has are skipped. It returns how many it adopted. The data comes from a snapshot
// whose signature the caller verified; it is still checked for shape.
func (p *Proxy) AdoptHeld(ctx context.Context, sandboxID string, data []byte) (int, error) {
	var in []*storedEffect
	if err := json.Unmarshal(data, &in); err != nil {
		return 0, fmt.Errorf("carried effects: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(in) > maxCarried {
		return 0, fmt.Errorf("carried effects: %d, at most %d: %w", len(in), maxCarried, errdefs.ErrInvalidArgument)
	}
	for _, e := range in {
		if err := checkCarried(e); err != nil {
			return 0, err
		}
	}
	j, err := p.journalFor(ctx, sandboxID, true)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range in {
		if _, err := j.effect(e.ID); err == nil {
			continue
		}
		c := *e
		c.Status, c.ResponseStatus, c.CompensateErr = StatusHeld, 0, ""
		if err := j.append(&record{Type: recEffect, Effect: &c}, true); err != nil {
			return n, fmt.Errorf("adopt effect %s: %w", e.ID, err)
		}
		n++
	}
	return n, nil
}

// checkCarried refuses a carried effect that is not a well-formed held request.
func checkCarried(e *storedEffect) error {
	if e == nil || !effectIDRE.MatchString(e.ID) {
		return fmt.Errorf("carried effect: bad id: %w", errdefs.ErrInvalidArgument)
	}
	if e.Status != StatusHeld || e.Compacted {
		return fmt.Errorf("carried effect %s: status %s (compacted %t), want a full held effect: %w", e.ID, e.Status, e.Compacted, errdefs.ErrInvalidArgument)
	}
	u, err := url.Parse(e.Request.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || e.Request.Method == "" {
		return fmt.Errorf("carried effect %s: bad request %s %q: %w", e.ID, e.Request.Method, e.Request.URL, errdefs.ErrInvalidArgument)
	}
	return nil
}
