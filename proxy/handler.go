package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// Headers the proxy sets on its own answers.
const (
	HeaderReason   = "X-Deltabox-Reason"
	HeaderEffectID = "X-Deltabox-Effect-Id"
)

// reqLog collects the fields of the one log line per proxy decision.
type reqLog struct {
	start    time.Time
	sandbox  string
	method   string
	host     string
	path     string
	rule     string
	decision string
	status   int
	reason   string
	bytes    int64
}

// handler is the http.Handler of the proxy's server; every connection it serves carries a
// connMeta in its context.
type handler struct{ p *Proxy }

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := h.p
	rl := &reqLog{start: time.Now(), method: sanitize(r.Method), path: sanitize(r.URL.Path)}
	defer p.logDecision(r.Context(), rl)
	m := metaFrom(r.Context())
	sb := p.sandboxAt(m.src)
	if sb == nil {
		rl.decision = string(ActionDeny)
		p.refuse(w, rl, http.StatusForbidden, fmt.Sprintf("unknown source address %s", m.src))
		return
	}
	rl.sandbox = sb.id
	if r.Method == http.MethodConnect {
		p.handleConnect(w, r, m, rl)
		return
	}
	tgt, rerr := targetOf(r, m)
	if rerr != nil {
		rl.decision = "reject"
		p.refuse(w, rl, rerr.status, rerr.reason)
		return
	}
	rl.host = tgt.host
	d := sb.policy.decide(tgt.host, tgt.port, r.Method, tgt.path)
	rl.rule, rl.decision = d.name, string(d.action)
	p.act(w, r, sb, tgt, d, rl)
}

func (p *Proxy) act(w http.ResponseWriter, r *http.Request, sb *sandbox, tgt *target, d decision, rl *reqLog) {
	if d.action == ActionDeny {
		p.refuse(w, rl, http.StatusForbidden, "denied by policy "+d.name)
		p.recordDenied(r.Context(), sb, r.Method, tgt, "denied by policy "+d.name)
		return
	}
	addrs, err := p.resolve(r.Context(), tgt.host, d.explicit)
	if err != nil {
		p.destinationFailed(w, rl, err)
		if errdefs.IsPermissionDenied(err) {
			p.recordDenied(r.Context(), sb, r.Method, tgt, err.Error())
		}
		return
	}
	ctx := withPinned(r.Context(), addrs)
	switch d.action {
	case ActionPass:
		if d.rule != nil && d.rule.Record {
			p.passRecorded(ctx, w, r, sb, tgt, rl)
			return
		}
		p.pass(ctx, w, r, sb, tgt, rl)
	case ActionHold:
		p.hold(ctx, w, r, sb, tgt, d, rl)
	case ActionCompensate:
		p.compensate(ctx, w, r, sb, tgt, d, rl)
	}
}

func (p *Proxy) destinationFailed(w http.ResponseWriter, rl *reqLog, err error) {
	if errdefs.IsPermissionDenied(err) {
		rl.decision = string(ActionDeny)
		p.refuse(w, rl, http.StatusForbidden, err.Error())
		return
	}
	rl.decision = "error"
	p.refuse(w, rl, http.StatusBadGateway, err.Error())
}

// refuse answers with status and the reason in X-Deltabox-Reason.
func (p *Proxy) refuse(w http.ResponseWriter, rl *reqLog, status int, reason string) {
	reason = sanitize(reason)
	rl.status, rl.reason = status, reason
	h := w.Header()
	h.Set(HeaderReason, reason)
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, reason+"\n")
}

func (p *Proxy) logDecision(ctx context.Context, rl *reqLog) {
	d := time.Since(rl.start)
	p.metrics.observe(rl.decision, d)
	log.L(ctx).Info("proxy decision",
		"sandbox", rl.sandbox, "method", rl.method, "host", rl.host, "path", rl.path,
		"rule", rl.rule, "decision", rl.decision, "bytes", rl.bytes,
		"duration_ms", float64(d.Microseconds())/1000, "status", rl.status, "reason", rl.reason)
}

// pass forwards the request and streams the answer back.
func (p *Proxy) pass(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *sandbox, tgt *target, rl *reqLog) {
	body := &countingReader{r: p.pacedBody(w, r)}
	out := outRequest(ctx, r.Method, tgt, r.Header, body, r.ContentLength)
	resp, err := p.transportFor(sb.id).RoundTrip(out)
	rl.bytes = body.n
	if err != nil {
		p.upstreamFailed(w, rl, err)
		return
	}
	defer resp.Body.Close()
	rl.status = resp.StatusCode
	p.recordPassed(ctx, sb, r.Method, tgt)
	copyResponse(w, resp, nil)
}

func (p *Proxy) upstreamFailed(w http.ResponseWriter, rl *reqLog, err error) {
	rl.decision = "error"
	p.refuse(w, rl, http.StatusBadGateway, upstreamReason(err))
}

// hold journals the request durably and answers at once.
func (p *Proxy) hold(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *sandbox, tgt *target, d decision, rl *reqLog) {
	body, ok := p.readBodyOrRefuse(w, r, rl)
	if !ok {
		return
	}
	eff := p.newEffect(StatusHeld, r.Method, tgt, r.Header, body, d.explicit)
	if err := p.journalAppend(ctx, sb.id, &record{Type: recEffect, Effect: eff}); err != nil {
		rl.decision = "error"
		status := http.StatusServiceUnavailable
		if errdefs.IsResourceExhausted(err) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			status = http.StatusInsufficientStorage // the journal's limit, or a full disk
		}
		p.refuse(w, rl, status, "cannot journal the request: "+err.Error())
		return
	}
	rl.status = writeHeld(w, d.rule, eff.ID)
}

func writeHeld(w http.ResponseWriter, rule *Rule, id string) int {
	h := w.Header()
	h.Set(HeaderEffectID, id)
	if rule != nil && rule.Response != nil {
		for k, v := range rule.Response.Headers {
			h.Set(k, v)
		}
		w.WriteHeader(rule.Response.Status)
		_, _ = io.WriteString(w, rule.Response.Body)
		return rule.Response.Status
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]any{"held": true, "effect_id": id})
	return http.StatusAccepted
}

// readBody reads a request body of at most limit bytes.
func readBody(r *http.Request, limit int64) ([]byte, *requestError) {
	if r.ContentLength > limit {
		return nil, reject(http.StatusRequestEntityTooLarge, "request body of %d bytes exceeds the limit of %d", r.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		rerr := reject(http.StatusBadRequest, "read request body: %v", err)
		rerr.cause = err
		return nil, rerr
	}
	if int64(len(body)) > limit {
		return nil, reject(http.StatusRequestEntityTooLarge, "request body exceeds the limit of %d bytes", limit)
	}
	return body, nil
}

// upstreamReason describes a failed round trip for X-Deltabox-Reason.
func upstreamReason(err error) string {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &record), errors.As(err, &alert):
		return "upstream TLS failure: " + err.Error()
	case errdefs.IsPermissionDenied(err):
		return err.Error()
	default:
		return "upstream failure: " + err.Error()
	}
}

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }
