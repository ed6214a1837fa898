package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"sync"
)

// Replay (docs/time-travel.md): a pass rule with `record: true` keeps the upstream's answers
// to the requests it passes, per sandbox, tagged with the checkpoint they were made after. A
// sandbox in replay mode (rolled back or forked with replay) gets the recorded answer to an
// identical request (method, URL, body) instead of a new one from the upstream, so a re-run
// from a checkpoint sees the world the first run saw. Recordings live in memory: a daemon
// restart forgets them. Bounded per sandbox: answers of at most 1 MiB, 32 MiB and 1024
// answers in all; beyond, requests pass unrecorded.

const (
	maxRecordedBody  = 1 << 20
	maxRecordedBytes = 32 << 20
	maxRecorded      = 1024
	// HeaderReplayed marks an answer replayed from a recording.
	HeaderReplayed = "X-Deltabox-Replayed"
)

// recorded is one kept answer.
type recorded struct {
	status     int
	header     http.Header
	body       []byte
	checkpoint string
}

// recordings are one sandbox's kept answers and whether it replays them.
type recordings struct {
	replay  bool
	answers map[string]*recorded // first answer per request key
	bytes   int64
}

// recorder holds every sandbox's recordings.
type recorder struct {
	mu  sync.Mutex
	all map[string]*recordings
}

func (r *recorder) of(id string) *recordings {
	if r.all == nil {
		r.all = map[string]*recordings{}
	}
	rs := r.all[id]
	if rs == nil {
		rs = &recordings{answers: map[string]*recorded{}}
		r.all[id] = rs
	}
	return rs
}

// SetReplay turns replay mode on or off for a sandbox.
func (p *Proxy) SetReplay(sandboxID string, on bool) {
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	p.rec.of(sandboxID).replay = on
}

// CopyRecordings gives sandbox to the recordings of sandbox from (a fork replaying its
// source's world) and sets its replay mode.
func (p *Proxy) CopyRecordings(from, to string, replay bool) {
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	src, dst := p.rec.of(from), p.rec.of(to)
	for k, a := range src.answers {
		if _, ok := dst.answers[k]; !ok && len(dst.answers) < maxRecorded {
			dst.answers[k] = a
			dst.bytes += int64(len(a.body))
		}
	}
	dst.replay = replay
}

// forgetRecordings drops a sandbox's recordings (RemoveSandbox, Forget).
func (p *Proxy) forgetRecordings(id string) {
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	delete(p.rec.all, id)
}

// requestKey identifies identical requests: method, absolute URL and body digest.
func requestKey(method string, tgt *target, body []byte) string {
	sum := sha256.Sum256(body)
	return method + " " + tgt.url.String() + " " + hex.EncodeToString(sum[:])
}

// passRecorded is pass for a rule with record: the answer is replayed when the sandbox
// replays and has one, else the request is forwarded and its answer kept.
func (p *Proxy) passRecorded(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *sandbox, tgt *target, rl *reqLog) {
	body, ok := p.readBodyOrRefuse(w, r, rl)
	if !ok {
		return
	}
	key := requestKey(r.Method, tgt, body)
	p.rec.mu.Lock()
	rs := p.rec.of(sb.id)
	a := rs.answers[key]
	replay := rs.replay && a != nil
	p.rec.mu.Unlock()
	if replay {
		rl.decision, rl.status = "replay", a.status
		h := w.Header()
		for k, vs := range a.header {
			h[k] = vs
		}
		h.Set(HeaderReplayed, "1")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		return
	}
	resp := p.sendBuffered(ctx, w, r, sb, tgt, rl, body)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	p.recordPassed(ctx, sb, r.Method, tgt)
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxRecordedBody+1))
	if err != nil || len(data) > maxRecordedBody {
		copyResponse(w, resp, data) // too big (or cut): passed on, not kept
		return
	}
	p.keepAnswer(ctx, sb.id, key, &recorded{status: resp.StatusCode, header: cleanHeader(resp.Header).Clone(), body: data})
	copyResponse(w, resp, data)
}

// keepAnswer records an answer unless one is kept for the key or the bounds are reached.
func (p *Proxy) keepAnswer(ctx context.Context, id, key string, a *recorded) {
	if j, err := p.journalFor(ctx, id, false); err == nil && j != nil {
		j.mu.Lock()
		a.checkpoint = j.ckpt
		j.mu.Unlock()
	}
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	rs := p.rec.of(id)
	if _, ok := rs.answers[key]; ok || len(rs.answers) >= maxRecorded || rs.bytes+int64(len(a.body)) > maxRecordedBytes {
		return
	}
	rs.answers[key] = a
	rs.bytes += int64(len(a.body))
}
