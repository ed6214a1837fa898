package proxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
)

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
	j.op.Lock() // not j.send: effects above a rollback's watermark are not a commit's
	defer j.op.Unlock()
	todo := j.snapshot(func(st *effectState) bool {
		return st.Seq > watermark && (st.Status == StatusHeld || (st.Status == StatusPassed && st.compensation))
	})
	for i := len(todo) - 1; i >= 0; i-- {
		st := todo[i]
		if st.Status == StatusHeld {
			ok, err := j.transition(&record{Type: recStatus, ID: st.ID, Status: StatusDropped}, false, StatusHeld)
			if err != nil {
				return dropped, compensated, err
			}
			if ok { // else a commit took it meanwhile (a forced rollback past a commit in progress)
				p.metrics.effectDone(StatusDropped)
				dropped++
			}
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
		return p.finishEffect(ctx, j, st.ID, StatusCompensated, 0, errors.New(se.CompensateErr))
	}
	code, derr := p.deliver(ctx, sandboxID, j, st.ID, *se.Compensation, IdempotencyKey(se.ID+"-compensate"))
	if ctx.Err() != nil {
		return Effect{}, ctx.Err()
	}
	return p.finishEffect(ctx, j, st.ID, StatusCompensated, code, derr)
}
