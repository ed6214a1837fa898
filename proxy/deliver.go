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

// sendEffect takes st for sending if it is still in one of the from states (durably marking
// it sending first), delivers it and records the outcome. sent is false if st was not taken
// (a rollback dropped it meanwhile). A held effect is delivered as its request; a passed one
// (sent at once, compensate rules) can only have failed compensating, so its compensating
// request is what is delivered again.
func (p *Proxy) sendEffect(ctx context.Context, sandboxID string, j *journal, st *effectState, from ...Status) (e Effect, sent bool, err error) {
	se, err := j.load(st)
	if err != nil {
		return Effect{}, false, err
	}
	ok, err := j.transition(&record{Type: recStatus, ID: st.ID, Status: StatusSending}, true, from...)
	if err != nil || !ok {
		return Effect{}, false, err
	}
	req, key, done := se.Request, IdempotencyKey(se.ID), StatusReleased
	if se.Status == StatusPassed {
		if se.Compensation == nil {
			e, err := p.finishEffect(ctx, j, st.ID, StatusCompensated, 0, errors.New(se.CompensateErr))
			return e, true, err
		}
		req, key, done = *se.Compensation, IdempotencyKey(se.ID+"-compensate"), StatusCompensated
	}
	code, derr := p.deliver(ctx, sandboxID, j, st.ID, req, key)
	if ctx.Err() != nil {
		return Effect{}, true, ctx.Err() // stays "sending"; a later commit or ResumeCommits retries it
	}
	e, err = p.finishEffect(ctx, j, st.ID, done, code, derr)
	return e, true, err
}

// finishEffect durably records the outcome of delivering an effect (or its compensation):
// status ok if the upstream answered below 400, failed otherwise.
func (p *Proxy) finishEffect(ctx context.Context, j *journal, id string, ok Status, code int, derr error) (Effect, error) {
	rec := &record{Type: recStatus, ID: id, Status: ok, ResponseStatus: code}
	if derr != nil || code >= 400 {
		rec.Status, rec.Error = StatusFailed, attemptError(code, derr)
	}
	if err := j.append(rec, true); err != nil {
		return Effect{}, err
	}
	p.metrics.effectDone(rec.Status)
	e, err := j.effect(id)
	log.L(ctx).Info("proxy effect", "effect", id, "status", rec.Status, "response_status", code, "attempts", e.Attempts, "error", rec.Error)
	return e, err
}

func attemptError(code int, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case code >= 400:
		return fmt.Sprintf("upstream answered %d", code)
	}
	return ""
}

// deliver sends req until an attempt succeeds, fails for good, or the configured attempts are
// used up, each attempt bounded by the commit timeout and journaled with its outcome, and
// waits the backoff (doubling, capped) between them. It returns the last answer's status.
func (p *Proxy) deliver(ctx context.Context, sandboxID string, j *journal, id string, req storedRequest, key string) (int, error) {
	backoff := p.cfg.commitBackoff
	for attempt := 1; ; attempt++ {
		code, err := p.attempt(ctx, sandboxID, req, key)
		if ctx.Err() != nil {
			return code, ctx.Err()
		}
		_ = j.append(&record{Type: recAttempt, ID: id, Attempt: &Attempt{
			Time: p.cfg.clock().UTC(), Status: code, Error: attemptError(code, err),
		}}, false) // made durable by the outcome's record
		if !retryable(code, err) || attempt >= p.cfg.commitAttempts {
			return code, err
		}
		j.setNext(id, p.cfg.clock().Add(backoff).UTC())
		select {
		case <-ctx.Done():
			return code, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, p.cfg.commitBackoffMax)
	}
}

// retryable reports whether another attempt may succeed: connection errors and timeouts,
// 408, 429 and 5xx answers. Refused destinations and malformed requests never will.
func retryable(code int, err error) bool {
	if err != nil {
		return !errdefs.IsPermissionDenied(err) && !errdefs.IsInvalidArgument(err)
	}
	return code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests
}

// attempt is one try, bounded by the commit timeout (connect, TLS, answer and its body).
func (p *Proxy) attempt(ctx context.Context, sandboxID string, req storedRequest, key string) (int, error) {
	actx, cancel := context.WithTimeout(ctx, p.cfg.commitTimeout)
	defer cancel()
	code, err := p.sendOnce(actx, sandboxID, req, key)
	if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("no answer within %s (commit timeout): %w: %w", p.cfg.commitTimeout, errdefs.ErrUnavailable, context.DeadlineExceeded)
	}
	return code, err
}

// sendOnce makes one attempt; the destination is resolved and checked now, like a passed
// request's, and the dial pinned to what passed.
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
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return resp.StatusCode, fmt.Errorf("read the answer: %w", err)
	}
	return resp.StatusCode, nil
}
