package orchestrator

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/state"
)

// API requests are bounded before their bodies are read: each sandbox may have only so many
// requests in flight at once (host API and its own socket together), every route has a body
// size limit, and the bodies that are read into memory (everything but the streamed routes:
// exec and file uploads) share one byte budget for the whole daemon. A request over any of
// them is refused at once with resource_exhausted (HTTP 429) naming the limit, so that a
// flood of large requests costs the daemon a bounded amount of memory.

// Defaults of the request limits.
const (
	DefaultRequestsPerSandbox = 16
	DefaultRequestBodyBudget  = 64 << 20
	// maxJSONBody bounds the body of every JSON route but the state patch.
	maxJSONBody = 1 << 20
	// maxStatePatchBody bounds a state patch: a whole document of the default size limit,
	// with room for the ops around it.
	maxStatePatchBody = state.DefaultMaxDocumentSize + 1<<20
)

// requestLimiter enforces the request limits; one serves both the host API and every
// sandbox's own socket.
type requestLimiter struct {
	perSandbox int
	budget     int64

	mu     sync.Mutex
	active map[string]int // requests in flight, by sandbox
	used   int64          // body bytes reserved by requests in flight
}

func newRequestLimiter(perSandbox int, budget int64) *requestLimiter {
	if perSandbox <= 0 {
		perSandbox = DefaultRequestsPerSandbox
	}
	if budget <= 0 {
		budget = DefaultRequestBodyBudget
	}
	return &requestLimiter{perSandbox: perSandbox, budget: budget, active: map[string]int{}}
}

// routeLimits says which sandbox a request is for ("" for none), the most body bytes it
// may send, and whether its body is streamed (not held in memory, so not charged to the
// budget; 0 limit: unbounded here, the handler bounds it).
func routeLimits(r *http.Request) (sandbox string, limit int64, streamed bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
	if ok {
		sandbox, rest, _ = strings.Cut(rest, "/")
	}
	switch {
	case r.Method == http.MethodPut && rest == "files", r.Method == http.MethodPost && rest == "exec":
		return sandbox, 0, true
	case r.Method == http.MethodPost && rest == "state":
		return sandbox, maxStatePatchBody, false
	}
	return sandbox, maxJSONBody, false
}

// wrap applies the limits to h.
func (l *requestLimiter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, err := l.admit(r)
		if err != nil {
			writeError(r.Context(), w, err)
			return
		}
		defer release()
		h.ServeHTTP(w, r)
	})
}

// admit takes a sandbox slot and the body's bytes from the budget, or says which limit the
// request is over. The returned func gives both back.
func (l *requestLimiter) admit(r *http.Request) (func(), error) {
	sandbox, limit, streamed := routeLimits(r)
	if limit > 0 && r.ContentLength > limit {
		return nil, fmt.Errorf("request body of %s %s is %d bytes, more than the limit of %d for this route: %w",
			r.Method, r.URL.Path, r.ContentLength, limit, errdefs.ErrResourceExhausted)
	}
	var reserve int64
	if !streamed {
		reserve = limit
		if r.ContentLength >= 0 {
			reserve = r.ContentLength
		}
		r.Body = http.MaxBytesReader(nil, r.Body, limit)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if sandbox != "" && l.active[sandbox] >= l.perSandbox {
		return nil, fmt.Errorf("sandbox %q has %d API requests in flight, the limit: retry when one finished: %w",
			sandbox, l.perSandbox, errdefs.ErrResourceExhausted)
	}
	if reserve > 0 && l.used+reserve > l.budget {
		return nil, fmt.Errorf("the daemon holds %d bytes of request bodies and this one needs %d more, over the limit of %d: retry later: %w",
			l.used, reserve, l.budget, errdefs.ErrResourceExhausted)
	}
	l.used += reserve
	if sandbox != "" {
		l.active[sandbox]++
	}
	return func() { l.release(sandbox, reserve) }, nil
}

func (l *requestLimiter) release(sandbox string, reserve int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used -= reserve
	if sandbox == "" {
		return
	}
	if l.active[sandbox]--; l.active[sandbox] <= 0 {
		delete(l.active, sandbox)
	}
}

// limiter returns the daemon's request limiter.
func (o *Orchestrator) limiter() *requestLimiter {
	o.limiterOnce.Do(func() { o.limits = newRequestLimiter(o.opts.RequestsPerSandbox, o.opts.RequestBodyBudget) })
	return o.limits
}
