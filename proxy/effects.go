package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/containerd/errdefs"
)

// Status is where an effect is in its life.
type Status string

// Effect statuses.
const (
	StatusHeld        Status = "held"        // journaled, not sent; waits for commit or rollback
	StatusSending     Status = "sending"     // a commit started sending it (it may have arrived)
	StatusReleased    Status = "released"    // sent on commit and answered below 400
	StatusFailed      Status = "failed"      // sending (or compensating) gave up or got >= 400
	StatusDropped     Status = "dropped"     // rolled back before it was sent
	StatusPassed      Status = "passed"      // sent at once (compensate, or pass when recorded)
	StatusDenied      Status = "denied"      // refused by the policy or the destination check; never sent
	StatusCompensated Status = "compensated" // rolled back: its compensating request was sent
	StatusAbandoned   Status = "abandoned"   // the operator gave it up after it failed: never sent again
)

// Effect is the public view of a journaled request.
type Effect struct {
	ID             string     `json:"id"`
	Seq            uint64     `json:"seq"`
	Checkpoint     string     `json:"checkpoint"`
	Method         string     `json:"method"`
	URL            string     `json:"url"`
	Status         Status     `json:"status"`
	ResponseStatus int        `json:"response_status,omitempty"`
	Attempts       int        `json:"attempts"`
	Created        time.Time  `json:"created"`
	Error          string     `json:"error,omitempty"`        // the last attempt's error
	History        []Attempt  `json:"history,omitempty"`      // every delivery attempt, oldest first
	NextAttempt    *time.Time `json:"next_attempt,omitempty"` // while a commit waits to try again
	// Suspect: the journal is damaged before this effect's state was last recorded, so a lost
	// record may have changed it (commits of the sandbox are refused; see Proxy.Damage).
	Suspect bool `json:"suspect,omitempty"`
}

// Attempt is the outcome of one delivery attempt of an effect (or of its compensation).
type Attempt struct {
	Time   time.Time `json:"time"`
	Status int       `json:"status,omitempty"` // the upstream's answer, 0 if none came
	Error  string    `json:"error,omitempty"`  // why it failed (also a 5xx answer), "" if it did not
}

// SetCheckpoint tags the effects the sandbox records from now on with ckpt (durably, so
// that it survives a restart).
//
// The mark is written without its own fsync: the next held effect's record, which is synced,
// makes it durable too (same file, written before). A crash before that loses only the tag
// of effects that were never recorded; the orchestrator sets the checkpoint again when it
// resumes a sandbox. Checkpoints stay off the fsync path this way.
func (p *Proxy) SetCheckpoint(ctx context.Context, sandboxID, ckpt string) error {
	j, err := p.journalFor(ctx, sandboxID, true)
	if err == nil {
		err = j.append(&record{Type: recCheckpoint, Checkpoint: ckpt}, false)
	}
	if err != nil {
		return fmt.Errorf("set checkpoint of %s: %w", sandboxID, err)
	}
	return nil
}

// ExpectWatermark tells the proxy that a checkpoint of the sandbox recorded its journal's
// watermark as seq. A journal with fewer effects (its file missing, or cut short) lost
// effects the sandbox was told were held: it is marked damaged, durably, so that the
// sandbox's commits are refused (errdefs.ErrDataLoss naming the lost sequence numbers) and
// new effects never reuse those numbers.
func (p *Proxy) ExpectWatermark(ctx context.Context, sandboxID string, seq uint64) error {
	if seq == 0 {
		return nil
	}
	j, err := p.journalFor(ctx, sandboxID, true)
	if err != nil {
		return err
	}
	j.mu.Lock()
	have := j.seq
	j.mu.Unlock()
	if have >= seq {
		return nil
	}
	why := fmt.Sprintf("a checkpoint recorded effects up to seq %d, the journal has %d (its file was missing or cut short)", seq, have)
	if err := j.append(&record{Type: recDamage, Upto: seq, Error: why}, true); err != nil {
		return fmt.Errorf("mark journal of %s damaged: %w", sandboxID, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.damageError()
}

// Damage returns the errdefs.ErrDataLoss error describing the damage of the sandbox's
// journal, or nil if it is intact.
func (p *Proxy) Damage(sandboxID string) error {
	j, err := p.journalFor(context.Background(), sandboxID, false)
	if err != nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.damageError()
}

// Watermark returns the sequence number of the sandbox's newest effect (0 if none). A
// checkpoint records it; Rollback to that checkpoint undoes every effect above it.
func (p *Proxy) Watermark(sandboxID string) uint64 {
	j, err := p.journalFor(context.Background(), sandboxID, false)
	if err != nil {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.seq
}

// Effects lists the sandbox's effects in sequence order, only those with one of the given
// statuses if any are given.
func (p *Proxy) Effects(sandboxID string, statuses ...Status) []Effect {
	j, err := p.journalFor(context.Background(), sandboxID, false)
	if err != nil {
		return nil
	}
	sts := j.snapshot(func(st *effectState) bool {
		return len(statuses) == 0 || contains(statuses, st.Status)
	})
	out := make([]Effect, len(sts))
	for i, st := range sts {
		out[i] = st.Effect
	}
	return out
}

// snapshot copies are marked Suspect by the journal (journal_scan.go suspects).

// Effect returns one effect; errdefs.ErrNotFound if the sandbox or effect is unknown.
func (p *Proxy) Effect(sandboxID, effectID string) (Effect, error) {
	j, err := p.journalFor(context.Background(), sandboxID, false)
	if err != nil {
		return Effect{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	st := j.byID[effectID]
	if st == nil {
		return Effect{}, fmt.Errorf("effect %q of sandbox %s: %w", sanitize(effectID), sandboxID, errdefs.ErrNotFound)
	}
	return st.Effect, nil
}

// RemoveSandbox deletes the sandbox's journal and forgets its connection pool. Held effects
// are gone with it; a commit in progress is cancelled (what it had not sent is not sent).
func (p *Proxy) RemoveSandbox(sandboxID string) error {
	if err := checkID(sandboxID); err != nil {
		return err
	}
	p.forgetRecordings(sandboxID)
	p.mu.Lock()
	j := p.journals[sandboxID]
	delete(p.journals, sandboxID)
	if t := p.transports[sandboxID]; t != nil {
		t.CloseIdleConnections()
		delete(p.transports, sandboxID)
	}
	p.mu.Unlock()
	if j != nil {
		j.cancelSend() // a commit to a hung upstream must not hold the release
		j.send.Lock()  // wait for the running commit to stop, and for a rollback
		defer j.send.Unlock()
		j.op.Lock()
		defer j.op.Unlock()
		_ = j.close()
	}
	path := p.journalDir + "/" + sandboxID + ".journal"
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove journal of %s: %w", sandboxID, err)
	}
	return nil
}

// RequestDetail is what a sandbox sent for an effect, as journaled: for `deltabox effects
// show`. Credentials (Authorization, Proxy-Authorization, Cookie) are redacted.
type RequestDetail struct {
	Method    string
	URL       string
	Header    http.Header
	Body      []byte
	Compacted bool // the journal dropped headers and body (the effect was settled long ago)
}

// redactedHeaders are shown as "[redacted]" by EffectRequest.
var redactedHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie"}

// EffectRequest returns the request an effect holds (or held); errdefs.ErrNotFound if the
// sandbox or effect is unknown.
func (p *Proxy) EffectRequest(sandboxID, effectID string) (RequestDetail, error) {
	j, err := p.journalFor(context.Background(), sandboxID, false)
	if err != nil {
		return RequestDetail{}, err
	}
	se, err := j.load(&effectState{Effect: Effect{ID: effectID}})
	if err != nil {
		return RequestDetail{}, fmt.Errorf("effect %q of sandbox %s: %w", sanitize(effectID), sandboxID, err)
	}
	h := se.Request.Header.Clone()
	for _, k := range redactedHeaders {
		if _, ok := h[k]; ok {
			h[k] = []string{"[redacted]"}
		}
	}
	return RequestDetail{Method: se.Request.Method, URL: se.Request.URL, Header: h, Body: se.Request.Body, Compacted: se.Compacted}, nil
}
