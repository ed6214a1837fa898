package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pool/initproto"
)

// ExecRequest is one command for a leased sandbox.
type ExecRequest struct {
	Argv      []string
	Env       []string // merged over the lease's env, which is merged over the template's
	Workdir   string   // default: the template's workdir
	User      string
	Timeout   time.Duration
	OutputCap int64
	Tag       string
	// Via picks the exec path: "" (the init, falling back to containerd's task exec when the
	// init does not answer), "init" or "containerd".
	Via string
	// Detach names a detached exec (initproto.ExecRequest.Detach): the command survives the
	// caller going away (a daemon restart) and Attach follows it again. Init only.
	Detach string
	// Started, when set, gets the command's pid in the sandbox once it runs (init only; Exec
	// and ExecTTY).
	Started func(pid int)
}

// Exec runs a command in a leased sandbox through its init, streaming output.
func (m *Manager) Exec(ctx context.Context, id string, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (initproto.ExitStatus, error) {
	sb, err := m.Get(id)
	if err != nil {
		return initproto.ExitStatus{}, err
	}
	if err := sb.Usable(); err != nil {
		return initproto.ExitStatus{}, err
	}
	start := time.Now()
	r := initproto.ExecRequest{
		Argv: req.Argv, Env: mergeEnv(sb.Env, req.Env), Workdir: req.Workdir, User: req.User,
		Stdin: stdin != nil, Timeout: req.Timeout, OutputCap: req.OutputCap, Tag: req.Tag, Detach: req.Detach,
	}
	if req.Detach != "" && req.Via == "containerd" {
		return initproto.ExitStatus{}, fmt.Errorf("a detached exec runs through the init, not containerd: %w", errdefs.ErrInvalidArgument)
	}
	if r.Workdir == "" {
		r.Workdir = sb.Workdir
	}
	var st initproto.ExitStatus
	switch req.Via {
	case "containerd":
		st, err = m.rt.execTask(ctx, sb.Container, r, stdin, stdout, stderr)
	case "", "init":
		st, err = sb.initc.ExecNotify(ctx, r, req.Started, stdin, stdout, stderr)
		if errors.Is(err, initproto.ErrNotListening) && req.Via == "" && req.Detach == "" {
			log.L(ctx).Warn("sandbox init does not answer; exec through containerd", "sandbox", id, "error", err)
			st, err = m.rt.execTask(ctx, sb.Container, r, stdin, stdout, stderr)
		}
	default:
		return st, fmt.Errorf("exec via %q: want init or containerd: %w", req.Via, errdefs.ErrInvalidArgument)
	}
	m.metrics.observeExec(time.Since(start))
	return st, err
}

// Attach follows a leased sandbox's detached exec again (see ExecRequest.Detach) from the
// stdout and stderr offsets in from, to its exit status.
func (m *Manager) Attach(ctx context.Context, id, key string, from [2]int64, stdout, stderr io.Writer) (initproto.ExitStatus, error) {
	sb, err := m.Get(id)
	if err != nil {
		return initproto.ExitStatus{}, err
	}
	if err := sb.Usable(); err != nil {
		return initproto.ExitStatus{}, err
	}
	return sb.initc.Attach(ctx, key, from, stdout, stderr)
}

// mergeEnv returns base with over's entries replacing those of the same key.
func mergeEnv(base, over []string) []string {
	if len(over) == 0 {
		return base
	}
	keys := make(map[string]bool, len(over))
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			out = append(out, kv)
		}
	}
	return append(out, over...)
}

// ExecTTY runs a command on a new terminal in a leased sandbox, through its init (the
// containerd exec path has no terminal here): what the terminal shows goes to out, input
// (typed bytes and window sizes) comes from input until it is closed; see
// initproto.Client.ExecTTY. size is the initial window size (zero: 24x80).
func (m *Manager) ExecTTY(ctx context.Context, id string, req ExecRequest, size initproto.WinSize, input <-chan initproto.TTYInput, out io.Writer) (initproto.ExitStatus, error) {
	if req.Via != "" && req.Via != "init" {
		return initproto.ExitStatus{}, fmt.Errorf("exec on a terminal via %q: only the sandbox init hosts terminals: %w", req.Via, errdefs.ErrInvalidArgument)
	}
	sb, err := m.Get(id)
	if err != nil {
		return initproto.ExitStatus{}, err
	}
	if err := sb.Usable(); err != nil {
		return initproto.ExitStatus{}, err
	}
	start := time.Now()
	r := initproto.ExecRequest{
		Argv: req.Argv, Env: mergeEnv(sb.Env, req.Env), Workdir: req.Workdir, User: req.User,
		Timeout: req.Timeout, OutputCap: req.OutputCap, Tag: req.Tag, TTY: &size,
	}
	if r.Workdir == "" {
		r.Workdir = sb.Workdir
	}
	st, err := sb.initc.ExecTTYNotify(ctx, r, req.Started, input, out)
	m.metrics.observeExec(time.Since(start))
	return st, err
}
