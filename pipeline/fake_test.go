package pipeline

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// execFunc plays a command in the fake sandbox: it gets the argv and the merged env (lease
// env overlaid with exec env) and returns the exit code.
type execFunc func(sb *fakeSandbox, argv []string, env map[string]string) int

// fakeClient is an in-memory daemon: a pool, sandboxes with checkpoint chains and commit
// points, state patches recorded per sandbox.
type fakeClient struct {
	mu       sync.Mutex
	pool     string
	max      int // sandboxes leased at once (0: no limit)
	exec     execFunc
	next     int
	leased   map[string]*fakeSandbox
	all      []*fakeSandbox
	maxLease int // most sandboxes leased at the same time
}

type fakeSandbox struct {
	id       string
	env      map[string]string
	ckpts    []string // chain, oldest first
	commit   string   // commit point ("" none)
	patches  []string
	rollTo   []string
	commits  int
	execs    []map[string]string
	messages []string
	released bool
	files    []string
}

func newFake(exec execFunc) *fakeClient {
	return &fakeClient{pool: "bb", exec: exec, leased: map[string]*fakeSandbox{}}
}

func (f *fakeClient) Pool(_ context.Context, name string) (api.PoolInfo, error) {
	if name != f.pool {
		return api.PoolInfo{}, fmt.Errorf("pool %q: %w", name, errdefs.ErrNotFound)
	}
	return api.PoolInfo{}, nil
}

func (f *fakeClient) Lease(_ context.Context, pool string, req api.LeaseRequest) (api.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if pool != f.pool {
		return api.Lease{}, fmt.Errorf("pool %q: %w", pool, errdefs.ErrNotFound)
	}
	if f.max > 0 && len(f.leased) >= f.max {
		return api.Lease{}, fmt.Errorf("pool at max: %w", errdefs.ErrUnavailable)
	}
	f.next++
	sb := &fakeSandbox{id: fmt.Sprintf("sb-%d", f.next), env: envMap(req.Env), ckpts: []string{"1"}}
	f.leased[sb.id] = sb
	f.all = append(f.all, sb)
	f.maxLease = max(f.maxLease, len(f.leased))
	var l api.Lease
	l.ID = sb.id
	return l, nil
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func (f *fakeClient) sandbox(id string) (*fakeSandbox, error) {
	sb := f.leased[id]
	if sb == nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (f *fakeClient) Exec(_ context.Context, id string, req api.ExecRequest, _ io.Reader, _, stderr io.Writer) (api.ExitStatus, error) {
	f.mu.Lock()
	sb, err := f.sandbox(id)
	if err != nil {
		f.mu.Unlock()
		return api.ExitStatus{}, err
	}
	env := envMap(req.Env)
	for k, v := range sb.env {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	sb.execs = append(sb.execs, env)
	f.mu.Unlock()
	code := f.exec(sb, req.Argv, env)
	if code != 0 {
		fmt.Fprintf(stderr, "boom %d", code)
	}
	return api.ExitStatus{Code: code}, nil
}

func (f *fakeClient) Checkpoint(_ context.Context, id string, req api.CheckpointRequest) (api.Checkpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(id)
	if err != nil {
		return api.Checkpoint{}, err
	}
	ck := fmt.Sprint(len(sb.ckpts) + 1)
	sb.ckpts = append(sb.ckpts, ck)
	sb.messages = append(sb.messages, req.Message)
	return api.Checkpoint{ID: ck, Level: req.Level}, nil
}

func (f *fakeClient) Rollback(_ context.Context, id string, req api.RollbackRequest) (api.RollbackResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(id)
	if err != nil {
		return api.RollbackResult{}, err
	}
	i := slices.Index(sb.ckpts, req.To)
	if i < 0 {
		return api.RollbackResult{}, fmt.Errorf("checkpoint %q: %w", req.To, errdefs.ErrNotFound)
	}
	if sb.commit != "" && i <= slices.Index(sb.ckpts, sb.commit) {
		return api.RollbackResult{}, fmt.Errorf("behind commit: %w", errdefs.ErrFailedPrecondition)
	}
	sb.ckpts = sb.ckpts[:i+1]
	sb.rollTo = append(sb.rollTo, req.To)
	return api.RollbackResult{ID: id, To: req.To}, nil
}

func (f *fakeClient) Commit(_ context.Context, id string) (api.CommitResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(id)
	if err != nil {
		return api.CommitResult{}, err
	}
	sb.commit = sb.ckpts[len(sb.ckpts)-1]
	sb.commits++
	return api.CommitResult{ID: id, Checkpoint: sb.commit}, nil
}

func (f *fakeClient) StatePatch(_ context.Context, id string, ops []byte, _ int64) (api.StatePatchResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(id)
	if err != nil {
		return api.StatePatchResult{}, err
	}
	sb.patches = append(sb.patches, string(ops))
	return api.StatePatchResult{Seq: uint64(len(sb.patches))}, nil
}

func (f *fakeClient) Effects(_ context.Context, id, _ string) ([]api.Effect, error) {
	return []api.Effect{{Status: "released"}, {Status: "dropped"}}, nil
}

func (f *fakeClient) Release(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(id)
	if err != nil {
		return err
	}
	sb.released = true
	delete(f.leased, id)
	return nil
}

func (f *fakeClient) CopyTo(_ context.Context, id, dest string, tarStream io.Reader) (rootfs.ExtractResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.sandbox(id)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	data, _ := io.ReadAll(tarStream)
	sb.files = append(sb.files, dest)
	return rootfs.ExtractResult{Entries: 1, Bytes: int64(len(data))}, nil
}
