package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

// controlRoutes registers the REST control plane.
func (g *Gateway) controlRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes", g.auth(g.createSandbox))
	mux.HandleFunc("POST /v2/sandboxes", g.auth(g.createSandbox))
	mux.HandleFunc("GET /sandboxes", g.auth(g.listSandboxes))
	mux.HandleFunc("GET /v2/sandboxes", g.auth(g.listSandboxes))
	mux.HandleFunc("GET /sandboxes/{id}", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		return http.StatusOK, sb.listed(true), nil
	}))
	mux.HandleFunc("DELETE /sandboxes/{id}", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		return http.StatusNoContent, nil, sb.kill(r.Context())
	}))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", g.authSandbox(g.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", g.authSandbox(g.refresh))
	mux.HandleFunc("POST /sandboxes/{id}/pause", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		var req pauseRequest // memory: false (a filesystem-only pause) is served like true
		if err := decodeBody(r, &req); err != nil {
			return 0, nil, err
		}
		return http.StatusNoContent, nil, sb.pause(r.Context())
	}))
	mux.HandleFunc("POST /sandboxes/{id}/resume", g.authSandbox(g.connect))
	mux.HandleFunc("POST /sandboxes/{id}/connect", g.authSandbox(g.connect))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", g.authSandbox(g.connect))
	mux.HandleFunc("GET /sandboxes/{id}/metrics", g.authSandbox(g.metrics))
	mux.HandleFunc("POST /sandboxes/{id}/fork", g.authSandbox(g.fork))
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", g.authSandbox(g.createSnapshot))
	mux.HandleFunc("GET /snapshots", g.auth(g.listSnapshots))
	mux.HandleFunc("DELETE /templates/{id}", g.auth(g.deleteSnapshot))
	g.deltaboxRoutes(mux)
}

// auth wraps a control-plane handler with the API key check: a request without a valid key
// is answered 401 before anything else is looked at.
func (g *Gateway) auth(fn func(r *http.Request, tenant string) (int, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := g.tenant(r)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), headerKey{}, w.Header()))
		status, v, err := fn(r, tenant)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		writeAPI(w, status, v)
	}
}

// authSandbox is auth for routes on one sandbox of the tenant's.
func (g *Gateway) authSandbox(fn func(r *http.Request, sb *sandbox) (int, any, error)) http.HandlerFunc {
	return g.auth(func(r *http.Request, tenant string) (int, any, error) {
		sb, err := g.owned(tenant, r.PathValue("id"))
		if err != nil {
			return 0, nil, err
		}
		return fn(r, sb)
	})
}

func writeAPI(w http.ResponseWriter, status int, v any) {
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeAPIError answers with the control plane's error body ({code, message}).
func writeAPIError(w http.ResponseWriter, err error) {
	_, status := connectCode(err)
	if status == 499 {
		status = http.StatusRequestTimeout
	}
	writeAPI(w, status, apiError{Code: status, Message: err.Error()})
}

// decodeBody reads an optional JSON body into v.
func decodeBody(r *http.Request, v any) error {
	err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(v)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("decode request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (g *Gateway) createSandbox(r *http.Request, tenant string) (int, any, error) {
	var req newSandboxRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	sb, err := g.create(r.Context(), tenant, req)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, sb.created(), nil
}

func (sb *sandbox) created() sandboxCreated {
	return sandboxCreated{TemplateID: sb.template, SandboxID: sb.id, ClientID: "deltabox",
		EnvdVersion: EnvdVersion, EnvdAccessToken: sb.token}
}

func (g *Gateway) listSandboxes(r *http.Request, tenant string) (int, any, error) {
	q := r.URL.Query()
	var states []string
	if s := q.Get("state"); s != "" {
		states = strings.Split(s, ",")
	}
	meta, err := metadataQuery(q.Get("metadata"))
	if err != nil {
		return 0, nil, err
	}
	var after time.Time
	if s := q.Get("startedAfter"); s != "" {
		if after, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return 0, nil, fmt.Errorf("startedAfter %q: want RFC 3339: %w", s, errdefs.ErrInvalidArgument)
		}
	}
	template := q.Get("template")
	g.mu.Lock()
	var sbs []*sandbox
	for _, sb := range g.sandboxes {
		if sb.tenant == tenant {
			sbs = append(sbs, sb)
		}
	}
	g.mu.Unlock()
	out := []sandboxListed{}
	for _, sb := range sbs {
		if !g.forgetGone(sb) && sb.matches(states, meta) && (template == "" || sb.template == template) && sb.started.After(after) {
			out = append(out, sb.listed(false))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].StartedAt != out[j].StartedAt {
			return out[i].StartedAt < out[j].StartedAt
		}
		return out[i].SandboxID < out[j].SandboxID
	})
	if q.Get("order") == "desc" {
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return page(r, out)
}

// page cuts a list to ?limit= items from ?nextToken= (an offset), and names the next page in
// the x-next-token header, as the SDK's paginator reads it.
func page(r *http.Request, all []sandboxListed) (int, any, error) {
	q := r.URL.Query()
	from := 0
	if tok := q.Get("nextToken"); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 {
			return 0, nil, fmt.Errorf("nextToken %q: %w", tok, errdefs.ErrInvalidArgument)
		}
		from = min(n, len(all))
	}
	to := len(all)
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return 0, nil, fmt.Errorf("limit %q: want a positive number: %w", l, errdefs.ErrInvalidArgument)
		}
		to = min(from+n, len(all))
	}
	if to < len(all) {
		w := r.Context().Value(headerKey{}).(http.Header)
		w.Set("X-Next-Token", strconv.Itoa(to))
	}
	return http.StatusOK, all[from:to], nil
}

// headerKey carries the response's header map to handlers that set headers.
type headerKey struct{}

// metadataQuery parses the list filter: a query string of key=value pairs, each encoded.
func metadataQuery(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	v, err := url.ParseQuery(s)
	if err != nil {
		return nil, fmt.Errorf("metadata filter %q: %v: %w", s, err, errdefs.ErrInvalidArgument)
	}
	out := map[string]string{}
	for k, vals := range v {
		key, _ := url.QueryUnescape(k)
		val, _ := url.QueryUnescape(vals[0])
		out[key] = val
	}
	return out, nil
}

func (g *Gateway) setTimeout(r *http.Request, sb *sandbox) (int, any, error) {
	var req timeoutRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	d, err := g.timeout(&req.Timeout)
	if err != nil {
		return 0, nil, err
	}
	if sb.isPaused() {
		return 0, nil, fmt.Errorf("sandbox %q is paused; connect to resume it first: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	sb.setTimeout(d)
	return http.StatusNoContent, nil, nil
}

// refresh extends the timeout by the given duration (legacy keep-alive).
func (g *Gateway) refresh(r *http.Request, sb *sandbox) (int, any, error) {
	var req struct {
		Duration int64 `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	d, err := g.timeout(&req.Duration)
	if err != nil {
		return 0, nil, err
	}
	sb.setTimeout(d)
	return http.StatusNoContent, nil, nil
}

// connect resumes a paused sandbox (201) or just re-arms a running one's timeout (200).
func (g *Gateway) connect(r *http.Request, sb *sandbox) (int, any, error) {
	var req connectRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	d, err := g.timeout(req.Timeout)
	if err != nil {
		return 0, nil, err
	}
	resumed, err := sb.resume(r.Context(), d)
	if err != nil {
		return 0, nil, err
	}
	if resumed {
		log.L(r.Context()).Info("e2b sandbox resumed", "sandbox", sb.id)
		return http.StatusCreated, sb.created(), nil
	}
	return http.StatusOK, sb.created(), nil
}

// metrics answers one sample taken now: memory in use (cgroup), CPU use since the previous
// sample (or since the sandbox was created), disk of the writable layer, and the limits.
func (g *Gateway) metrics(r *http.Request, sb *sandbox) (int, any, error) {
	info, err := g.b.Sandbox(sb.id)
	if err != nil {
		return 0, nil, err
	}
	cpuNs, mem, err := g.b.SandboxUsage(sb.id)
	if err != nil {
		return 0, nil, err
	}
	now := time.Now()
	cpus := info.Limits.CPUs
	if cpus <= 0 {
		cpus = float64(runtime.NumCPU())
	}
	m := metric{Timestamp: now.UTC().Format(time.RFC3339Nano), TimestampUnix: now.Unix(),
		CPUCount: int(cpus + 0.999), MemUsed: int64(mem), MemTotal: info.Limits.MemoryBytes}
	sb.mu.Lock()
	lastAt, lastCPU := sb.lastSample, sb.lastCPU
	if lastAt.IsZero() {
		lastAt, lastCPU = info.Created, 0
	}
	sb.lastSample, sb.lastCPU = now, cpuNs
	sb.mu.Unlock()
	if wall := now.Sub(lastAt); wall > 0 && cpuNs >= lastCPU {
		m.CPUUsedPct = float64(cpuNs-lastCPU) / float64(wall.Nanoseconds()) / cpus * 100
	}
	_ = g.withRoot(r.Context(), sb, func(root *rootfs.Root) error {
		if st, err := root.StatfsDir("."); err == nil {
			m.DiskTotal = int64(st.Blocks) * st.Bsize
			m.DiskUsed = int64(st.Blocks-st.Bfree) * st.Bsize
		}
		return nil
	})
	return http.StatusOK, []metric{m}, nil
}

// deltaboxRoutes are DeltaBox's own routes on an E2B sandbox (not part of E2B's API): plain
// REST with the same API key, for checkpoints, rollback and commit.
func (g *Gateway) deltaboxRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes/{id}/deltabox/checkpoints", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		var req api.CheckpointRequest
		if err := decodeBody(r, &req); err != nil {
			return 0, nil, err
		}
		if err := sb.running(); err != nil {
			return 0, nil, err
		}
		ck, err := g.b.Checkpoint(r.Context(), sb.id, req)
		return http.StatusCreated, ck, err
	}))
	mux.HandleFunc("GET /sandboxes/{id}/deltabox/checkpoints", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		cks, err := g.b.Checkpoints(r.Context(), sb.id)
		return http.StatusOK, cks, err
	}))
	mux.HandleFunc("POST /sandboxes/{id}/deltabox/rollback", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		var req api.RollbackRequest
		if err := decodeBody(r, &req); err != nil {
			return 0, nil, err
		}
		if err := sb.running(); err != nil {
			return 0, nil, err
		}
		res, err := g.b.Rollback(r.Context(), sb.id, req)
		return http.StatusOK, res, err
	}))
	mux.HandleFunc("POST /sandboxes/{id}/deltabox/commit", g.authSandbox(func(r *http.Request, sb *sandbox) (int, any, error) {
		res, err := g.b.Commit(r.Context(), sb.id)
		return http.StatusOK, res, err
	}))
}

// running fails for a paused sandbox (its processes are frozen).
func (sb *sandbox) running() error {
	if sb.isPaused() {
		return fmt.Errorf("sandbox %q is paused; connect to resume it first: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	return nil
}
