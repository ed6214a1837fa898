package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// CommitResult summarizes a commit.
type CommitResult struct {
	Released int      `json:"released"`
	Failed   int      `json:"failed"`
	Effects  []Effect `json:"effects"` // the effects this commit sent, in order, as they ended
}

// IdempotencyKey is the Idempotency-Key header value sent with an effect: stable across
// retries and restarts, so an upstream that honours it applies the effect once.
func IdempotencyKey(effectID string) string { return "deltabox-" + effectID }

// Commit sends every effect held up to now, in recorded order, each with its
// Idempotency-Key, retrying connection errors and 5xx answers with backoff. The journal
// records the commit and each effect's "sending" state first, so that ResumeCommits finishes
// an interrupted commit after a crash. An error (e.g. a cancelled ctx) leaves the rest held.
func (p *Proxy) Commit(ctx context.Context, sandboxID string) (CommitResult, error) {
	return p.CommitTo(ctx, sandboxID, 0)
}

// CommitTo is Commit of the effects with seq <= upto only (0: every effect held now): the
// caller fixed the cut earlier, e.g. the watermark at its commit point, and effects recorded
// since stay held. Calling it again with the same upto finishes an interrupted commit.
func (p *Proxy) CommitTo(ctx context.Context, sandboxID string, upto uint64) (CommitResult, error) {
	j, err := p.journalFor(ctx, sandboxID, false)
	if errdefs.IsNotFound(err) && checkID(sandboxID) == nil {
		return CommitResult{}, nil // nothing was ever held
	}
	if err != nil {
		return CommitResult{}, err
	}
	j.op.Lock()
	defer j.op.Unlock()
	j.mu.Lock()
	if upto == 0 || upto > j.seq {
		upto = j.seq
	}
	derr := j.damageError()
	j.mu.Unlock()
	if derr != nil {
		return CommitResult{}, fmt.Errorf("commit %s: %w", sandboxID, derr)
	}
	if err := j.append(&record{Type: recCommit, Upto: upto}, true); err != nil {
		return CommitResult{}, fmt.Errorf("commit %s: %w", sandboxID, err)
	}
	res, err := p.release(ctx, sandboxID, j, upto)
	if err == nil {
		j.maybeCompact(ctx)
	}
	return res, err
}

// ResumeCommits finishes every commit a previous process started and did not finish.
func (p *Proxy) ResumeCommits(ctx context.Context) error {
	p.mu.RLock()
	ids := make(map[string]*journal, len(p.journals))
	for id, j := range p.journals {
		ids[id] = j
	}
	p.mu.RUnlock()
	var errs []error
	for id, j := range ids {
		j.op.Lock()
		j.mu.Lock()
		upto := j.pending
		j.mu.Unlock()
		if upto > 0 {
			log.L(ctx).Info("proxy: resuming interrupted commit", "sandbox", id, "upto", upto)
			if _, err := p.release(ctx, id, j, upto); err != nil {
				errs = append(errs, err)
			}
		}
		j.op.Unlock()
	}
	return errors.Join(errs...)
}

// release sends the held (or interrupted) effects up to upto. Callers hold j.op.
func (p *Proxy) release(ctx context.Context, sandboxID string, j *journal, upto uint64) (CommitResult, error) {
	var res CommitResult
	todo := j.snapshot(func(st *effectState) bool {
		return st.Seq <= upto && (st.Status == StatusHeld || st.Status == StatusSending)
	})
	for _, st := range todo {
		e, err := p.sendEffect(ctx, sandboxID, j, st)
		if err != nil {
			return res, fmt.Errorf("commit %s: effect %s: %w", sandboxID, st.ID, err)
		}
		res.Effects = append(res.Effects, e)
		if e.Status == StatusReleased {
			res.Released++
		} else {
			res.Failed++
		}
	}
	if err := j.append(&record{Type: recCommitDone, Upto: upto}, true); err != nil {
		return res, fmt.Errorf("commit %s: %w", sandboxID, err)
	}
	return res, nil
}

// sendEffect marks st sending, delivers it and records the outcome.
func (p *Proxy) sendEffect(ctx context.Context, sandboxID string, j *journal, st *effectState) (Effect, error) {
	se, err := j.load(st)
	if err != nil {
		return Effect{}, err
	}
	if st.Status == StatusHeld {
		if err := j.append(&record{Type: recStatus, ID: st.ID, Status: StatusSending}, true); err != nil {
			return Effect{}, err
		}
	}
	status, attempts, derr := p.deliver(ctx, sandboxID, se.Request, IdempotencyKey(se.ID))
	if ctx.Err() != nil {
		return Effect{}, ctx.Err() // stays "sending"; a later commit or ResumeCommits retries it
	}
	return p.finishEffect(ctx, j, st, StatusReleased, status, st.Attempts+attempts, derr)
}

// finishEffect records the outcome of sending an effect (or its compensation).
func (p *Proxy) finishEffect(ctx context.Context, j *journal, st *effectState, ok Status, code, attempts int, derr error) (Effect, error) {
	rec := &record{Type: recStatus, ID: st.ID, Status: ok, ResponseStatus: code, Attempts: attempts}
	if derr != nil || code >= 400 {
		rec.Status = StatusFailed
		if derr != nil {
			rec.Error = derr.Error()
		} else {
			rec.Error = fmt.Sprintf("upstream answered %d", code)
		}
	}
	if err := j.append(rec, true); err != nil {
		return Effect{}, err
	}
	p.metrics.effectDone(rec.Status)
	log.L(ctx).Info("proxy effect", "effect", st.ID, "status", rec.Status, "response_status", code, "attempts", attempts, "error", rec.Error)
	e, err := j.effect(st.ID)
	return e, err
}

// deliver sends req with retries on connection errors and 5xx; it returns the last status.
func (p *Proxy) deliver(ctx context.Context, sandboxID string, req storedRequest, key string) (int, int, error) {
	backoff := p.cfg.commitBackoff
	var lastErr error
	status := 0
	for attempt := 1; attempt <= p.cfg.commitAttempts; attempt++ {
		status, lastErr = p.sendOnce(ctx, sandboxID, req, key)
		if errdefs.IsPermissionDenied(lastErr) || errdefs.IsInvalidArgument(lastErr) {
			return status, attempt, lastErr
		}
		if lastErr == nil && status < 500 {
			return status, attempt, nil
		}
		if attempt == p.cfg.commitAttempts {
			return status, attempt, lastErr
		}
		select {
		case <-ctx.Done():
			return status, attempt, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
	return status, p.cfg.commitAttempts, lastErr
}

// sendOnce makes one attempt; the destination is checked and pinned like a passed request.
func (p *Proxy) sendOnce(ctx context.Context, sandboxID string, req storedRequest, key string) (int, error) {
	u, err := url.Parse(req.URL)
	if err != nil {
		return 0, fmt.Errorf("effect URL: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	host, _, err := splitHostPort(u.Host, defaultPort(u.Scheme))
	if err != nil {
		return 0, fmt.Errorf("effect URL: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	addrs, err := p.resolve(ctx, host, req.AllowPrivate)
	if err != nil {
		return 0, err
	}
	out, err := http.NewRequestWithContext(withPinned(ctx, addrs), req.Method, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return 0, fmt.Errorf("effect request: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	out.Header.Set("Idempotency-Key", key)
	resp, err := p.transportFor(sandboxID).RoundTrip(out)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Rollback undoes the sandbox's effects above watermark, newest first: held effects are
// dropped (never sent), passed effects with a compensating request get it sent. Effects
// already released by a commit cannot be undone and are left alone.
func (p *Proxy) Rollback(ctx context.Context, sandboxID string, watermark uint64) (dropped, compensated int, err error) {
	j, err := p.journalFor(ctx, sandboxID, false)
	if errdefs.IsNotFound(err) && checkID(sandboxID) == nil {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	j.op.Lock()
	defer j.op.Unlock()
	todo := j.snapshot(func(st *effectState) bool {
		return st.Seq > watermark && (st.Status == StatusHeld || (st.Status == StatusPassed && st.compensation))
	})
	for i := len(todo) - 1; i >= 0; i-- {
		st := todo[i]
		if st.Status == StatusHeld {
			if err := j.append(&record{Type: recStatus, ID: st.ID, Status: StatusDropped}, false); err != nil {
				return dropped, compensated, err
			}
			p.metrics.effectDone(StatusDropped)
			dropped++
			continue
		}
		e, err := p.compensateEffect(ctx, sandboxID, j, st)
		if err != nil {
			return dropped, compensated, fmt.Errorf("rollback %s: effect %s: %w", sandboxID, st.ID, err)
		}
		if e.Status == StatusCompensated {
			compensated++
		}
	}
	if err := j.flush(); err != nil {
		return dropped, compensated, err
	}
	j.maybeCompact(ctx)
	return dropped, compensated, nil
}

func (p *Proxy) compensateEffect(ctx context.Context, sandboxID string, j *journal, st *effectState) (Effect, error) {
	se, err := j.load(st)
	if err != nil {
		return Effect{}, err
	}
	if se.Compensation == nil {
		return p.finishEffect(ctx, j, st, StatusCompensated, 0, 0, errors.New(se.CompensateErr))
	}
	status, attempts, derr := p.deliver(ctx, sandboxID, *se.Compensation, IdempotencyKey(se.ID+"-compensate"))
	if ctx.Err() != nil {
		return Effect{}, ctx.Err()
	}
	return p.finishEffect(ctx, j, st, StatusCompensated, status, attempts, derr)
}
