package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// fakeBackend stands in for the orchestrator: one pool "py", sandboxes rooted in temp dirs,
// execs answered by a function.
type fakeBackend struct {
	t      *testing.T
	mu     sync.Mutex
	n      int
	live   map[string]string            // id -> root dir
	labels map[string]map[string]string // id -> lease labels
	ip     string                       // every sandbox's address
	forked map[string]string            // id -> ForkedFrom
	log    []string                     // calls, in order
	exec   func(req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) api.ExitStatus
	tty    func(ctx context.Context, req api.ExecRequest, input <-chan api.TTYInput, out io.Writer) api.ExitStatus
	signal func(tag, sig string)
	pid    int // the last command's pid is 200+pid
}

func newFake(t *testing.T) *fakeBackend {
	return &fakeBackend{t: t, live: map[string]string{}, labels: map[string]map[string]string{}}
}

func (f *fakeBackend) Sandboxes() []api.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []api.Sandbox{}
	for id := range f.live {
		out = append(out, api.Sandbox{ID: id, Labels: f.labels[id], ForkedFrom: f.forked[id]})
	}
	return out
}

func (f *fakeBackend) record(call string) {
	f.mu.Lock()
	f.log = append(f.log, call)
	f.mu.Unlock()
}

func (f *fakeBackend) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

func (f *fakeBackend) Lease(ctx context.Context, pool string, req api.LeaseRequest) (api.Lease, error) {
	f.record("lease " + pool)
	if pool != "py" {
		return api.Lease{}, fmt.Errorf("pool %q: %w", pool, errdefs.ErrNotFound)
	}
	f.mu.Lock()
	f.n++
	id := fmt.Sprintf("sb-%d", f.n)
	f.live[id] = f.t.TempDir()
	f.labels[id] = req.Labels
	f.mu.Unlock()
	return api.Lease{LeaseResult: api.LeaseResult{Sandbox: api.Sandbox{ID: id, Pool: pool}}}, nil
}

func (f *fakeBackend) Release(ctx context.Context, id string) error {
	f.record("release " + id)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[id]; !ok {
		return errdefs.ErrNotFound
	}
	delete(f.live, id)
	return nil
}

func (f *fakeBackend) ForkSandbox(ctx context.Context, id string, count int) ([]api.Lease, error) {
	return nil, fmt.Errorf("fork: %w", errdefs.ErrNotImplemented)
}

func (f *fakeBackend) PushSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	return api.Snapshot{}, fmt.Errorf("snapshot: %w", errdefs.ErrNotImplemented)
}

func (f *fakeBackend) RestoreSnapshot(ctx context.Context, uri, pool string) (api.Lease, error) {
	return api.Lease{}, fmt.Errorf("restore: %w", errdefs.ErrNotImplemented)
}

func (f *fakeBackend) SandboxUsage(id string) (uint64, uint64, error) { return 0, 0, nil }

func (f *fakeBackend) SnapshotRemove(ctx context.Context, uri string) error { return nil }

func (f *fakeBackend) Sandbox(id string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[id]; !ok {
		return api.Sandbox{}, errdefs.ErrNotFound
	}
	return api.Sandbox{ID: id, IP: f.ip}, nil
}

// nextPid is the pid in the sandbox of the fake's next command.
func (f *fakeBackend) nextPid() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pid++
	return 200 + f.pid
}

func (f *fakeBackend) ExecNotify(ctx context.Context, id string, req api.ExecRequest, started func(int), stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error) {
	f.record("exec " + strings.Join(req.Argv, " "))
	pid := f.nextPid()
	if started != nil {
		started(pid)
	}
	st := f.exec(req, stdin, stdout, stderr)
	st.Pid = pid
	return st, nil
}

func (f *fakeBackend) ExecTTY(ctx context.Context, id string, req api.ExecRequest, started func(int), input <-chan api.TTYInput, out io.Writer) (api.ExitStatus, error) {
	f.record(fmt.Sprintf("exec-tty %dx%d %s", req.TTY.Rows, req.TTY.Cols, strings.Join(req.Argv, " ")))
	pid := f.nextPid()
	if started != nil && f.tty != nil {
		started(pid)
	}
	if f.tty == nil { // a command that could not be started: no start report
		return api.ExitStatus{Code: 127, Error: "no terminal in this fake"}, nil
	}
	st := f.tty(ctx, req, input, out)
	st.Pid = pid
	return st, nil
}

func (f *fakeBackend) KillTag(ctx context.Context, id, tag string) (int, error) {
	f.record("kill " + tag)
	return 1, nil
}

func (f *fakeBackend) SignalTag(ctx context.Context, id, tag, sig string) (int, error) {
	f.record("signal " + sig + " " + tag)
	if f.signal != nil {
		f.signal(tag, sig)
	}
	return 1, nil
}

func (f *fakeBackend) SandboxRoot(ctx context.Context, id string) (*rootfs.Root, error) {
	f.mu.Lock()
	dir, ok := f.live[id]
	f.mu.Unlock()
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return rootfs.Open(dir)
}

func (f *fakeBackend) root(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[id]
}

func (f *fakeBackend) Freeze(ctx context.Context, id string) error { f.record("freeze"); return nil }
func (f *fakeBackend) Thaw(ctx context.Context, id string) error   { f.record("thaw"); return nil }
func (f *fakeBackend) Checkpoint(ctx context.Context, id string, req api.CheckpointRequest) (api.Checkpoint, error) {
	f.record("checkpoint")
	return api.Checkpoint{ID: "2"}, nil
}
func (f *fakeBackend) Checkpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	return []api.Checkpoint{}, nil
}
func (f *fakeBackend) Rollback(ctx context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error) {
	return api.RollbackResult{}, nil
}
func (f *fakeBackend) Commit(ctx context.Context, id string) (api.CommitResult, error) {
	return api.CommitResult{}, nil
}

const (
	keyA = "tenant-a-key-0123456789"
	keyB = "tenant-b-key-0123456789"
)

func TestListPages(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	for i := 0; i < 3; i++ {
		create(t, srv, keyA)
	}
	var ids []string
	tok := ""
	for page := 0; page < 5; page++ {
		req, _ := http.NewRequest("GET", srv.URL+"/v2/sandboxes?limit=2&nextToken="+tok, nil)
		req.Header.Set("X-API-KEY", keyA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var items []sandboxListed
		json.NewDecoder(resp.Body).Decode(&items)
		resp.Body.Close()
		for _, it := range items {
			ids = append(ids, it.SandboxID)
		}
		if tok = resp.Header.Get("X-Next-Token"); tok == "" {
			break
		}
	}
	if len(ids) != 3 || ids[0] == ids[1] || ids[1] == ids[2] {
		t.Errorf("pages gave %v, want the 3 sandboxes once each", ids)
	}
	if _, body := call(t, "GET", srv.URL+"/v2/sandboxes?template=other", keyA, nil); strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("template filter: %s", body)
	}
	if _, body := call(t, "GET", srv.URL+"/v2/sandboxes?startedAfter="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), keyA, nil); strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("startedAfter filter: %s", body)
	}
	if status, _ := call(t, "GET", srv.URL+"/v2/sandboxes?limit=0", keyA, nil); status != http.StatusBadRequest {
		t.Errorf("limit=0: %d", status)
	}
}

func TestReleasedElsewhereIsForgotten(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	f.Release(context.Background(), c.SandboxID) // e.g. `deltabox release` on the host
	if status, _ := call(t, "GET", srv.URL+"/sandboxes/"+c.SandboxID, keyA, nil); status != http.StatusNotFound {
		t.Errorf("info of a sandbox released elsewhere: %d", status)
	}
	if _, body := call(t, "GET", srv.URL+"/v2/sandboxes", keyA, nil); strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("list: %s", body)
	}
}

func TestUploadOverTheCapFails(t *testing.T) {
	r := &capReader{r: strings.NewReader("12345"), left: 4}
	if _, err := io.ReadAll(r); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a read past the cap: %v", err)
	}
	r = &capReader{r: strings.NewReader("1234"), left: 4}
	if data, err := io.ReadAll(r); err != nil || string(data) != "1234" {
		t.Errorf("a read up to the cap: %q %v", data, err)
	}
}

func TestRestartRecoversSandboxes(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	call(t, "POST", srv.URL+"/v2/sandboxes", keyB, map[string]any{"templateID": "py", "metadata": map[string]string{"k": "v"}})
	f.mu.Lock() // a fork of c, made before the restart, carries c's labels
	f.live["sb-fork"], f.labels["sb-fork"] = t.TempDir(), f.labels[c.SandboxID]
	f.forked = map[string]string{"sb-fork": c.SandboxID + "@2"}
	f.mu.Unlock()
	srv2 := newTestGateway(t, f, Options{}) // a restarted daemon's gateway over the same leases
	forkHdr := []string{"E2b-Sandbox-Id", "sb-fork", "X-Access-Token", c.EnvdAccessToken}
	if status, _ := call(t, "POST", srv2.URL+"/filesystem.Filesystem/ListDir", "", map[string]any{"path": "/"}, forkHdr...); status != http.StatusUnauthorized {
		t.Errorf("the source's token opened its recovered fork: %d", status)
	}
	if status, _ := call(t, "GET", srv2.URL+"/sandboxes/sb-fork", keyA, nil); status != http.StatusOK {
		t.Errorf("the recovered fork is not its tenant's: %d", status)
	}
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	if status, body := call(t, "POST", srv2.URL+"/filesystem.Filesystem/ListDir", "", map[string]any{"path": "/"}, hdr...); status != http.StatusOK {
		t.Errorf("the old access token after a restart: %d %s", status, body)
	}
	if status, _ := call(t, "GET", srv2.URL+"/sandboxes/"+c.SandboxID, keyB, nil); status != http.StatusNotFound {
		t.Errorf("tenant B sees tenant A's recovered sandbox: %d", status)
	}
	_, body := call(t, "GET", srv2.URL+"/v2/sandboxes", keyB, nil)
	if !strings.Contains(string(body), `"metadata":{"k":"v"}`) {
		t.Errorf("tenant B's recovered list: %s", body)
	}
	status, body := call(t, "POST", srv2.URL+"/v2/sandboxes/"+c.SandboxID+"/connect", keyA, map[string]any{})
	var again sandboxCreated
	json.Unmarshal(body, &again)
	if status != http.StatusOK || again.EnvdAccessToken == "" || again.EnvdAccessToken == c.EnvdAccessToken {
		t.Errorf("connect after a restart: %d %s (want a new token)", status, body)
	}
	hdr[3] = again.EnvdAccessToken
	if status, body := call(t, "POST", srv2.URL+"/filesystem.Filesystem/ListDir", "", map[string]any{"path": "/"}, hdr...); status != http.StatusOK {
		t.Errorf("the new access token: %d %s", status, body)
	}
}

func newTestGateway(t *testing.T, f *fakeBackend, opts Options) *httptest.Server {
	t.Helper()
	opts.Keys = []string{keyA, keyB}
	g, err := New(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(func() { g.Close(context.Background()) })
	return srv
}

func call(t *testing.T, method, url, key string, body any, hdr ...string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, url, rd)
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func create(t *testing.T, srv *httptest.Server, key string) sandboxCreated {
	t.Helper()
	status, body := call(t, "POST", srv.URL+"/v2/sandboxes", key, map[string]any{"templateID": "py"})
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var c sandboxCreated
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWrongKeyTouchesNoSandbox(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	for _, key := range []string{"", "not-a-key-of-this-gateway"} {
		for _, r := range [][2]string{{"POST", "/v2/sandboxes"}, {"GET", "/v2/sandboxes"}, {"DELETE", "/sandboxes/sb-1"}, {"POST", "/sandboxes/sb-1/deltabox/rollback"}} {
			status, body := call(t, r[0], srv.URL+r[1], key, map[string]any{"templateID": "py"})
			if status != http.StatusUnauthorized || !strings.Contains(string(body), `"code":401`) {
				t.Errorf("%s %s with key %q: %d %s, want 401", r[0], r[1], key, status, body)
			}
		}
	}
	if c := f.calls(); len(c) != 0 {
		t.Errorf("refused requests reached the backend: %v", c)
	}
}

func TestUnknownTemplateIsNotFound(t *testing.T) {
	srv := newTestGateway(t, newFake(t), Options{})
	status, body := call(t, "POST", srv.URL+"/v2/sandboxes", keyA, map[string]any{"templateID": "nope"})
	if status != http.StatusNotFound || !strings.Contains(string(body), `template \"nope\" not found`) {
		t.Errorf("unknown template: %d %s", status, body)
	}
}

func TestOtherTenantIsRefused(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	for _, r := range [][2]string{{"GET", "/sandboxes/" + c.SandboxID}, {"DELETE", "/sandboxes/" + c.SandboxID},
		{"POST", "/v2/sandboxes/" + c.SandboxID + "/connect"}, {"POST", "/sandboxes/" + c.SandboxID + "/pause"},
		{"POST", "/sandboxes/" + c.SandboxID + "/timeout"}, {"POST", "/sandboxes/" + c.SandboxID + "/deltabox/checkpoints"}} {
		if status, body := call(t, r[0], srv.URL+r[1], keyB, map[string]any{}); status != http.StatusNotFound {
			t.Errorf("tenant B %s %s: %d %s, want 404", r[0], r[1], status, body)
		}
	}
	if _, body := call(t, "GET", srv.URL+"/v2/sandboxes", keyB, nil); strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("tenant B lists %s", body)
	}
	// In-sandbox calls need the sandbox's own access token, not just its ID.
	for _, tok := range []string{"", "wrong"} {
		status, body := call(t, "POST", srv.URL+"/filesystem.Filesystem/Stat", "", map[string]any{"path": "/"},
			"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", tok)
		if status != http.StatusUnauthorized || !strings.Contains(string(body), "unauthenticated") {
			t.Errorf("stat with token %q: %d %s", tok, status, body)
		}
	}
	if status, body := call(t, "GET", srv.URL+"/", "", nil, "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", "8080"); status != http.StatusUnauthorized {
		t.Errorf("another port without the token: %d %s", status, body)
	}
	for _, call := range f.calls() {
		if strings.HasPrefix(call, "release") || strings.HasPrefix(call, "freeze") || strings.HasPrefix(call, "checkpoint") {
			t.Errorf("tenant B's requests reached the backend: %s", call)
		}
	}
}

// frames splits a Connect streaming body into its messages and end-of-stream payload.
func frames(t *testing.T, body []byte) (msgs []string, end string) {
	t.Helper()
	for len(body) > 0 {
		if len(body) < 5 {
			t.Fatalf("short frame header: %q", body)
		}
		n := binary.BigEndian.Uint32(body[1:5])
		data := string(body[5 : 5+n])
		if body[0]&endStreamFlag != 0 {
			end = data
		} else {
			msgs = append(msgs, data)
		}
		body = body[5+n:]
	}
	return msgs, end
}

func envelope(v any) []byte {
	data, _ := json.Marshal(v)
	out := make([]byte, 5, 5+len(data))
	binary.BigEndian.PutUint32(out[1:], uint32(len(data)))
	return append(out, data...)
}

func TestStartStreamsOutputAndExit(t *testing.T) {
	f := newFake(t)
	f.exec = func(req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) api.ExitStatus {
		stdout.Write([]byte("hi"))
		stderr.Write([]byte("oops"))
		return api.ExitStatus{Code: 3}
	}
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	req, _ := http.NewRequest("POST", srv.URL+"/process.Process/Start", bytes.NewReader(envelope(map[string]any{
		"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "echo hi"}, "envs": map[string]string{"A": "b"}}})))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", c.SandboxID)
	req.Header.Set("X-Access-Token", c.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	msgs, end := frames(t, body)
	// 201 is the command's pid in the (fake) sandbox, as the init reported it.
	want := []string{`{"event":{"start":{"pid":201}}}`, `{"event":{"data":{"stdout":"aGk="}}}`,
		`{"event":{"data":{"stderr":"b29wcw=="}}}`, `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}`}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") || end != "{}" {
		t.Errorf("stream:\n%s\nend %s\nwant:\n%s", strings.Join(msgs, "\n"), end, strings.Join(want, "\n"))
	}
	// The image has no bash: the command runs under /bin/sh, without bash's -l.
	if calls := f.calls(); calls[len(calls)-1] != "exec /bin/sh -c echo hi" {
		t.Errorf("exec call: %v", calls)
	}
}

func TestTimeoutReleases(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{DefaultTimeout: 30 * time.Millisecond})
	c := create(t, srv, keyA)
	deadline := time.Now().Add(5 * time.Second)
	for !contains(f.calls(), "release "+c.SandboxID) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox was not released when its timeout passed: %v", f.calls())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, _ := call(t, "GET", srv.URL+"/sandboxes/"+c.SandboxID, keyA, nil); status != http.StatusNotFound {
		t.Errorf("info after the timeout: %d", status)
	}
	if status, body := call(t, "POST", srv.URL+"/v2/sandboxes", keyA, map[string]any{"templateID": "py", "timeout": -1}); status != http.StatusBadRequest {
		t.Errorf("negative timeout: %d %s", status, body)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestFilesRefuseSymlinksTheSandboxMade(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	dir := f.root(c.SandboxID)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	if status, body := call(t, "GET", srv.URL+"/files?path=/link/secret", "", nil, hdr...); status == http.StatusOK || strings.Contains(string(body), "host secret") {
		t.Errorf("read through a symlink: %d %s", status, body)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/files?path=/link/planted", strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set(hdr[0], hdr[1])
	req.Header.Set(hdr[2], hdr[3])
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode == http.StatusOK {
		t.Errorf("write through a symlink: %v %v", resp, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Errorf("a write followed the sandbox's symlink out of its root")
	}
	call(t, "POST", srv.URL+"/filesystem.Filesystem/Remove", "", map[string]any{"path": "/link"}, hdr...)
	if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
		t.Errorf("removing the symlink removed its target: %v", err)
	}
}

// TestPortsGoToTheSandboxOnly: a request for another port of a sandbox is passed to that
// port of the sandbox's address, without the gateway's headers, for token holders only.
func TestPortsGoToTheSandboxOnly(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app %s %s token=%q", r.Method, r.URL.Path, r.Header.Get("X-Access-Token")+r.Header.Get(TrafficTokenHeader))
	}))
	defer app.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(app.URL, "http://"))
	f := newFake(t)
	f.ip = "127.0.0.1"
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	status, body := call(t, "GET", srv.URL+"/hello", "", nil, "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", port, TrafficTokenHeader, c.EnvdAccessToken)
	if status != http.StatusOK || string(body) != `app GET /hello token=""` {
		t.Errorf("proxied: %d %s", status, body)
	}
	status, body = call(t, "GET", srv.URL+"/hello", "", nil, "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", port, TrafficTokenHeader, "wrong")
	if status != http.StatusUnauthorized || strings.Contains(string(body), "app") {
		t.Errorf("a wrong token reached the port: %d %s", status, body)
	}
	if status, _ := call(t, "GET", srv.URL+"/", "", nil, "E2b-Sandbox-Id", c.SandboxID, "E2b-Sandbox-Port", "99999", "X-Access-Token", c.EnvdAccessToken); status != http.StatusBadRequest {
		t.Errorf("port 99999: %d", status)
	}
}

func TestSandboxFromHost(t *testing.T) {
	for host, want := range map[string][2]string{
		"49983-sb-1a2b.e2b.example.com": {"sb-1a2b", "49983"},
		"8080-sb-x.d":                   {"sb-x", "8080"},
		"127.0.0.1:3000":                {"", ""},
		"api.e2b.example.com":           {"", ""},
		"x9-sb.d":                       {"", ""},
	} {
		if id, port := sandboxFromHost(host); id != want[0] || port != want[1] {
			t.Errorf("sandboxFromHost(%q) = %q, %q; want %q, %q", host, id, port, want[0], want[1])
		}
	}
}

func TestWatchDiff(t *testing.T) {
	before := map[string]sig{"a": {ino: 1, size: 1}, "b": {ino: 2}, "c": {ino: 3, mode: 0o644}}
	after := map[string]sig{"a": {ino: 1, size: 2}, "c": {ino: 3, mode: 0o600}, "d": {ino: 4}}
	got := fmt.Sprint(diff(before, after))
	want := "[{a EVENT_TYPE_WRITE} {b EVENT_TYPE_REMOVE} {c EVENT_TYPE_CHMOD} {d EVENT_TYPE_CREATE}]"
	if got != want {
		t.Errorf("diff = %s, want %s", got, want)
	}
}

func TestReadKeys(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("# comment\n\n"+keyA+"\n  "+keyB+"  \n"), 0o600)
	if keys, err := ReadKeys(good); err != nil || len(keys) != 2 || keys[1] != keyB {
		t.Errorf("ReadKeys = %v, %v", keys, err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	if _, err := ReadKeys(short); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a short key: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("# nothing\n"), 0o600)
	if _, err := ReadKeys(empty); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no key: %v", err)
	}
}
