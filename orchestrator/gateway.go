package orchestrator

import (
	"context"
	"io"
	"time"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// The methods below let gateways that speak another API (orchestrator/e2b) drive sandboxes
// the way the /v1 handlers do, without going through HTTP: the same session, egress and
// release rules apply.

// Sandbox describes a leased sandbox.
func (o *Orchestrator) Sandbox(id string) (api.Sandbox, error) {
	sb, err := o.pools.Get(id)
	return apiSandbox(sb), err
}

// Exec runs a command in a leased sandbox, as POST /v1/sandboxes/{id}/exec does: the
// sandbox's first checkpoint is taken before anything runs.
func (o *Orchestrator) Exec(ctx context.Context, id string, req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error) {
	return o.ExecNotify(ctx, id, req, nil, stdin, stdout, stderr)
}

// ExecNotify is Exec that calls started, when not nil, with the command's pid in the sandbox
// once it runs, before any output (not at all when it could not be started, when it runs
// through containerd, or when the sandbox's init predates start reports).
func (o *Orchestrator) ExecNotify(ctx context.Context, id string, req api.ExecRequest, started func(pid int), stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error) {
	if _, err := o.session(ctx, id); err != nil {
		return api.ExitStatus{}, err
	}
	st, err := o.pools.Exec(ctx, id, pool.ExecRequest{
		Argv: req.Argv, Env: req.Env, Workdir: req.Workdir, User: req.User,
		Timeout: time.Duration(req.TimeoutMS * float64(time.Millisecond)), OutputCap: req.OutputCap, Tag: req.Tag, Via: req.Via,
		Started: started,
	}, stdin, stdout, stderr)
	return apiExitStatus(st), err
}

// KillTag kills the processes of a sandbox's execs tagged tag (and their descendants).
func (o *Orchestrator) KillTag(ctx context.Context, id, tag string) (int, error) {
	return o.pools.KillTag(ctx, id, tag)
}

// SignalTag sends sig ("SIGTERM", "SIGINT", ...; "SIGKILL" kills as KillTag does) once to the
// processes of a sandbox's execs tagged tag and their descendants, without waiting for them.
func (o *Orchestrator) SignalTag(ctx context.Context, id, tag, sig string) (int, error) {
	if sig == "" || sig == "SIGKILL" {
		return o.pools.KillTag(ctx, id, tag)
	}
	return o.pools.SignalTag(ctx, id, tag, sig)
}

// SandboxRoot opens a leased sandbox's root filesystem for symlink-safe access from the host.
func (o *Orchestrator) SandboxRoot(ctx context.Context, id string) (*rootfs.Root, error) {
	if _, err := o.session(ctx, id); err != nil { // files change only after the first checkpoint
		return nil, err
	}
	return o.pools.Root(id)
}

// Freeze pauses every process of a leased sandbox (runc pause); Thaw resumes them.
func (o *Orchestrator) Freeze(ctx context.Context, id string) error { return o.pools.Pause(ctx, id) }

// Thaw undoes Freeze.
func (o *Orchestrator) Thaw(ctx context.Context, id string) error { return o.pools.Resume(ctx, id) }

// Sandboxes lists the leased sandboxes (not the quarantined ones).
func (o *Orchestrator) Sandboxes() []api.Sandbox { return apiSandboxes(o.pools.List()) }

// ForkSandbox restores count copies of a sandbox from one L3 snapshot of it (as
// POST /v1/sandboxes/{id}/fork does, without progress events); the snapshot is removed after.
func (o *Orchestrator) ForkSandbox(ctx context.Context, id string, count int) ([]api.Lease, error) {
	return o.Fork(ctx, id, api.SnapshotRequest{Count: count}, func(api.Progress) {})
}

// PushSnapshot takes an L3 snapshot of a sandbox into the daemon's object store.
func (o *Orchestrator) PushSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	return o.SnapshotPush(ctx, id, "", func(api.Progress) {})
}

// RestoreSnapshot restores a snapshot into a new sandbox leased from pool.
func (o *Orchestrator) RestoreSnapshot(ctx context.Context, uri, pool string) (api.Lease, error) {
	return o.Restore(ctx, uri, pool, func(api.Progress) {})
}

// SandboxUsage reads a leased sandbox's CPU time and memory in use from its cgroup.
func (o *Orchestrator) SandboxUsage(id string) (cpuNanos, memoryBytes uint64, err error) {
	u, err := o.pools.Usage(id)
	return u.CPUNanos, u.MemoryBytes, err
}
