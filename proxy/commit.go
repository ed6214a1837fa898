package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// Delivery promise. An effect is sent at least once per commit (or retry) that takes it, and
// every attempt, across retries, restarts and operator retries, carries the same
// Idempotency-Key (IdempotencyKey of its ID): an upstream that honours the key applies it
// exactly once; one that ignores it may apply it once per attempt. Nothing stronger is
// promised: a connection that breaks after the upstream applied a request cannot be told
// from one that broke before.

// CommitResult summarizes a commit (or a retry).
type CommitResult struct {
	Released int      `json:"released"`
	Failed   int      `json:"failed"`
	Effects  []Effect `json:"effects"` // the effects this commit sent, in order, as they ended
}

// FailedError is nil if no effect of r failed, else an errdefs.ErrFailedPrecondition error
// naming each failed effect, its attempts and its last error.
func (r CommitResult) FailedError() error {
	var parts []string
	for _, e := range r.Effects {
		if e.Status == StatusFailed {
			parts = append(parts, fmt.Sprintf("%s (%s %s, %d attempts: %s)", e.ID, e.Method, e.URL, e.Attempts, e.Error))
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("%d effects failed: %s; retry or abandon them (deltabox effects retry|abandon): %w",
		len(parts), strings.Join(parts, "; "), errdefs.ErrFailedPrecondition)
}

// IdempotencyKey is the Idempotency-Key header value sent with every attempt of an effect:
// "deltabox-" and the effect's ID, stable across attempts, retries and restarts.
func IdempotencyKey(effectID string) string { return "deltabox-" + effectID }

// Commit is CommitTo of every effect held now.
func (p *Proxy) Commit(ctx context.Context, sandboxID string) (CommitResult, error) {
	return p.CommitTo(ctx, sandboxID, 0)
}

// CommitTo sends the effects held with seq <= upto (0: every effect held now), in recorded
// order, each with its Idempotency-Key, retrying connection errors, timeouts, 408, 429 and
// 5xx answers within the configured attempts (WithCommitRetry, WithCommitTimeout). The
// caller fixed the cut earlier (e.g. the watermark at its commit point); effects recorded
// since stay held, and calling it again with the same upto finishes an interrupted commit.
//
// The journal records the commit and each effect's "sending" state durably before its first
// byte is sent, so ResumeCommits finishes an interrupted commit after a crash. The caller
// need hold no lock: commits, retries and resumes of a sandbox serialize among themselves,
// and a concurrent Rollback never drops an effect a commit took (or the reverse). An effect
// that used up its attempts is failed and counted in Failed (see FailedError): it is the
// operator's to retry or abandon. An error (e.g. a cancelled ctx, a damaged journal) leaves
// the rest held, or sending for ResumeCommits.
func (p *Proxy) CommitTo(ctx context.Context, sandboxID string, upto uint64) (CommitResult, error) {
	j, err := p.journalFor(ctx, sandboxID, false)
	if errdefs.IsNotFound(err) && checkID(sandboxID) == nil {
		return CommitResult{}, nil // nothing was ever held
	}
	if err != nil {
		return CommitResult{}, err
	}
	j.send.Lock()
	defer j.send.Unlock()
	ctx, done := j.sending(ctx)
	defer done()
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

// ResumeCommits finishes every commit a previous process started and did not finish. It may
// run in the background while the proxy serves: each sandbox's commit serializes with new
// commits and retries of that sandbox, and ctx bounds it.
func (p *Proxy) ResumeCommits(ctx context.Context) error {
	p.mu.RLock()
	ids := make(map[string]*journal, len(p.journals))
	for id, j := range p.journals {
		ids[id] = j
	}
	p.mu.RUnlock()
	var errs []error
	for id, j := range ids {
		if err := p.resume(ctx, id, j); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *Proxy) resume(ctx context.Context, id string, j *journal) error {
	j.send.Lock()
	defer j.send.Unlock()
	ctx, done := j.sending(ctx)
	defer done()
	j.mu.Lock()
	upto, derr := j.pending, j.damageError()
	j.mu.Unlock()
	if upto == 0 {
		return nil
	}
	if derr != nil {
		return fmt.Errorf("resume commit of %s: %w", id, derr)
	}
	log.L(ctx).Info("proxy: resuming interrupted commit", "sandbox", id, "upto", upto)
	_, err := p.release(ctx, id, j, upto)
	return err
}

// release sends the held (or interrupted) effects up to upto. Callers hold j.send.
func (p *Proxy) release(ctx context.Context, sandboxID string, j *journal, upto uint64) (CommitResult, error) {
	todo := j.snapshot(func(st *effectState) bool {
		return st.Seq <= upto && (st.Status == StatusHeld || st.Status == StatusSending)
	})
	res, err := p.sendAll(ctx, sandboxID, j, todo, StatusHeld, StatusSending)
	if err != nil {
		return res, err
	}
	if err := j.append(&record{Type: recCommitDone, Upto: upto}, true); err != nil {
		return res, fmt.Errorf("commit %s: %w", sandboxID, err)
	}
	return res, nil
}

// sendAll sends each effect of todo that is still in one of the from states.
func (p *Proxy) sendAll(ctx context.Context, sandboxID string, j *journal, todo []*effectState, from ...Status) (CommitResult, error) {
	var res CommitResult
	for _, st := range todo {
		e, sent, err := p.sendEffect(ctx, sandboxID, j, st, from...)
		if err != nil {
			return res, fmt.Errorf("commit %s: effect %s: %w", sandboxID, st.ID, err)
		}
		if !sent {
			continue // a rollback dropped it meanwhile
		}
		res.Effects = append(res.Effects, e)
		if e.Status == StatusReleased {
			res.Released++
		} else {
			res.Failed++
		}
	}
	return res, nil
}

// Retry sends failed effects of the sandbox again, with a fresh budget of attempts and the
// same Idempotency-Key: the ones named, or every failed one if none is. A failed
// compensation is retried as the compensating request. On a damaged journal (Damage) only
// named effects are sent, and held or sending ones may be named too if a commit already
// took their sequence number: the operator decided. Effects the sandbox has not committed
// are never sent. The result's FailedError tells what failed again.
func (p *Proxy) Retry(ctx context.Context, sandboxID string, effectIDs ...string) (CommitResult, error) {
	j, err := p.journalFor(ctx, sandboxID, false)
	if err != nil {
		return CommitResult{}, err
	}
	j.send.Lock()
	defer j.send.Unlock()
	ctx, done := j.sending(ctx)
	defer done()
	todo, from, err := j.retryable(effectIDs)
	if err != nil {
		return CommitResult{}, fmt.Errorf("retry effects of %s: %w", sandboxID, err)
	}
	return p.sendAll(ctx, sandboxID, j, todo, from...)
}

// retryable picks the effects Retry sends and the states they may be taken from.
func (j *journal) retryable(ids []string) ([]*effectState, []Status, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	derr := j.damageError()
	if len(ids) == 0 {
		if derr != nil {
			return nil, nil, fmt.Errorf("name the effects to retry: %w", derr)
		}
		var out []*effectState
		for _, st := range j.effects {
			if st.Status == StatusFailed {
				c := *st
				out = append(out, &c)
			}
		}
		return out, []Status{StatusFailed}, nil
	}
	from := []Status{StatusFailed}
	if derr != nil {
		from = append(from, StatusHeld, StatusSending)
	}
	var out []*effectState
	for _, id := range ids {
		st := j.byID[id]
		switch {
		case st == nil:
			return nil, nil, fmt.Errorf("effect %q: %w", sanitize(id), errdefs.ErrNotFound)
		case !contains(from, st.Status) || st.Seq > j.committed:
			return nil, nil, fmt.Errorf("effect %s is %s, not failed in a commit: %w", id, st.Status, errdefs.ErrFailedPrecondition)
		}
		c := *st
		out = append(out, &c)
	}
	return out, from, nil
}

// Abandon gives up a failed effect for good: it is never sent again and stays listed as
// abandoned. On a damaged journal, held or sending effects may be abandoned too (the
// operator decided what the lost records cannot tell).
func (p *Proxy) Abandon(ctx context.Context, sandboxID, effectID string) (Effect, error) {
	j, err := p.journalFor(ctx, sandboxID, false)
	if err != nil {
		return Effect{}, err
	}
	j.send.Lock()
	defer j.send.Unlock()
	from := []Status{StatusFailed}
	if j.isDamaged() {
		from = append(from, StatusHeld, StatusSending)
	}
	ok, err := j.transition(&record{Type: recStatus, ID: effectID, Status: StatusAbandoned, Error: "abandoned by the operator"}, true, from...)
	if err != nil {
		return Effect{}, fmt.Errorf("abandon effect %s of %s: %w", effectID, sandboxID, err)
	}
	e, eerr := j.effect(effectID)
	if eerr != nil {
		return Effect{}, fmt.Errorf("abandon effect %q of %s: %w", sanitize(effectID), sandboxID, eerr)
	}
	if !ok {
		return e, fmt.Errorf("abandon effect %s of %s: it is %s, not failed: %w", effectID, sandboxID, e.Status, errdefs.ErrFailedPrecondition)
	}
	p.metrics.effectDone(StatusAbandoned)
	log.L(ctx).Info("proxy effect", "sandbox", sandboxID, "effect", effectID, "status", StatusAbandoned)
	return e, nil
}

// isDamaged reports whether the journal is damaged.
func (j *journal) isDamaged() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.damageError() != nil
}
