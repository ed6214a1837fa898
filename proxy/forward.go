package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// hopHeaders are connection-scoped and never forwarded (RFC 9110 7.6.1), plus the proxy's own.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect",
}

// cleanHeader copies h without hop-by-hop headers (also those named in Connection).
func cleanHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		out.Del(name)
	}
	return out
}

// outRequest builds the upstream request; ctx carries the pinned addresses.
func outRequest(ctx context.Context, method string, tgt *target, h http.Header, body io.ReadCloser, n int64) *http.Request {
	if n == 0 {
		body = http.NoBody
	}
	out := &http.Request{
		Method: method, URL: tgt.url, Host: tgt.url.Host, Header: cleanHeader(h),
		Body: body, ContentLength: n, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
	}
	return out.WithContext(ctx)
}

// copyResponse writes resp to w, flushing as data arrives (server-sent events, long polls);
// prefix is body already read from resp.Body.
func copyResponse(w http.ResponseWriter, resp *http.Response, prefix []byte) int64 {
	h := w.Header()
	for k, vs := range cleanHeader(resp.Header) {
		h[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	n, _ := w.Write(prefix)
	buf := make([]byte, 32<<10)
	total := int64(n)
	for {
		k, err := resp.Body.Read(buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return total
			}
			total += int64(k)
			_ = rc.Flush()
		}
		if err != nil {
			return total
		}
	}
}

func (p *Proxy) newTransport() *http.Transport {
	return &http.Transport{
		Proxy:       nil, // never an environment proxy
		DialContext: p.dialPinned,
		TLSClientConfig: &tls.Config{
			RootCAs: p.roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"},
		},
		TLSNextProto:           map[string]func(string, *tls.Conn) http.RoundTripper{},
		ForceAttemptHTTP2:      false,
		DisableCompression:     true,
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    32,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  5 * time.Minute,
		MaxResponseHeaderBytes: 1 << 20,
	}
}

func (p *Proxy) newEffect(status Status, method string, tgt *target, h http.Header, body []byte, explicit bool) *storedEffect {
	return &storedEffect{
		ID: newEffectID(), Status: status, Created: p.cfg.clock().UTC(),
		Request: storedRequest{
			Method: method, URL: tgt.url.String(), Header: cleanHeader(h), Body: body, AllowPrivate: explicit,
		},
	}
}

func newEffectID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "eff-" + hex.EncodeToString(b[:])
}

// journalAppend durably appends r to the sandbox's journal.
func (p *Proxy) journalAppend(ctx context.Context, sandboxID string, r *record) error {
	j, err := p.journalFor(ctx, sandboxID, true)
	if err != nil {
		return err
	}
	return j.append(r, true)
}

func (p *Proxy) recordPassed(ctx context.Context, sb *sandbox, method string, tgt *target) {
	if !p.cfg.recordPassed {
		return
	}
	eff := p.newEffect(StatusPassed, method, tgt, nil, nil, false)
	j, err := p.journalFor(ctx, sb.id, true)
	if err == nil {
		err = j.append(&record{Type: recEffect, Effect: eff}, false)
	}
	if err != nil {
		log.L(ctx).Warn("proxy: cannot record passed request", "sandbox", sb.id, "error", err)
	}
}

// recordDenied journals a refused request as a denied effect (not durably, as passed ones:
// it changes nothing a commit or rollback does) so that `effects ls --status denied` shows
// what the sandbox tried and why it was refused.
func (p *Proxy) recordDenied(ctx context.Context, sb *sandbox, method string, tgt *target, reason string) {
	eff := p.newEffect(StatusDenied, method, tgt, nil, nil, false)
	eff.Reason = reason
	j, err := p.journalFor(ctx, sb.id, true)
	if err == nil {
		err = j.append(&record{Type: recEffect, Effect: eff}, false)
	}
	if err != nil {
		log.L(ctx).Warn("proxy: cannot record denied request", "sandbox", sb.id, "error", err)
	}
}

// sendBuffered sends the request with its already read body upstream and records the answer's
// status; on a transport failure it answers the sandbox and returns nil.
func (p *Proxy) sendBuffered(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *sandbox, tgt *target, rl *reqLog, body []byte) *http.Response {
	out := outRequest(ctx, r.Method, tgt, r.Header, io.NopCloser(bytes.NewReader(body)), int64(len(body)))
	resp, err := p.transportFor(sb.id).RoundTrip(out)
	if err != nil {
		p.upstreamFailed(w, rl, err)
		return nil
	}
	rl.status = resp.StatusCode
	return resp
}

// compensate forwards the request now and journals it with its compensating request.
func (p *Proxy) compensate(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *sandbox, tgt *target, d decision, rl *reqLog) {
	body, ok := p.readBodyOrRefuse(w, r, rl)
	if !ok {
		return
	}
	resp := p.sendBuffered(ctx, w, r, sb, tgt, rl, body)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	respBody, _ := io.ReadAll(io.LimitReader(resp.Body, p.cfg.bodyLimit))
	eff := p.newEffect(StatusPassed, r.Method, tgt, r.Header, body, d.explicit)
	eff.ResponseStatus = resp.StatusCode
	if resp.StatusCode < 400 {
		var err error
		eff.Compensation, err = renderCompensation(d.rule.Compensate, sb.policy, eff.Request, resp, respBody)
		if err != nil {
			eff.CompensateErr = err.Error()
			log.L(ctx).Warn("proxy: cannot render compensation", "sandbox", sb.id, "effect", eff.ID, "error", err)
		}
	}
	if err := p.journalAppend(ctx, sb.id, &record{Type: recEffect, Effect: eff}); err != nil {
		rl.decision = "error"
		p.refuse(w, rl, http.StatusBadGateway, "request was sent but cannot be journaled: "+err.Error())
		return
	}
	w.Header().Set(HeaderEffectID, eff.ID)
	copyResponse(w, resp, respBody)
}
