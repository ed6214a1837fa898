//go:build linux

package criu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/log"
)

// Checkpointer dumps running containerd tasks to CRIU images directories and restores tasks
// from them, through containerd's runc shim (which runs runc, which runs CRIU).
type Checkpointer struct {
	client      *containerd.Client
	criuPath    string
	workRoot    string
	dumpTimeout time.Duration
	lazy        bool // WithLazyPages

	lazyRestores atomic.Int64

	mu     sync.Mutex
	status *Status
}

// Opt configures a Checkpointer.
type Opt func(*Checkpointer)

// WithStatus hands over the daemon's CRIU Status (from Checker.Check); without it the
// Checkpointer probes CRIU on first use.
func WithStatus(st Status) Opt {
	return func(c *Checkpointer) { c.status = &st }
}

// WithCRIUPath names the CRIU binary probed when no Status is given (default "criu"). runc
// finds its own CRIU on PATH: keep both the same.
func WithCRIUPath(p string) Opt { return func(c *Checkpointer) { c.criuPath = p } }

// WithWorkRoot sets where restores create their CRIU work directories (restore.log);
// default os.TempDir(). A failed restore keeps its work directory and names it in the error.
func WithWorkRoot(dir string) Opt { return func(c *Checkpointer) { c.workRoot = dir } }

// WithDumpTimeout bounds one dump (default DefaultDumpTimeout): past it the checkpoint call
// is cancelled (the shim kills runc, and CRIU, left alone, cures the processes and exits) and
// Dump fails with context.DeadlineExceeded, so a dump that hangs (a process CRIU cannot seize, a stuck
// shim) never holds the sandbox or its caller for good.
func WithDumpTimeout(d time.Duration) Opt { return func(c *Checkpointer) { c.dumpTimeout = d } }

// DefaultDumpTimeout bounds a dump when WithDumpTimeout is not given. A dump of a few hundred
// MiB of memory takes a few seconds here.
const DefaultDumpTimeout = 2 * time.Minute

// New returns a Checkpointer using client, whose context must carry the containerd namespace.
func New(client *containerd.Client, opts ...Opt) *Checkpointer {
	c := &Checkpointer{client: client, criuPath: "criu", dumpTimeout: DefaultDumpTimeout}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Status returns the CRIU status the Checkpointer works with, probing CRIU once if needed.
func (c *Checkpointer) Status(ctx context.Context) Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == nil {
		st := NewChecker(c.criuPath).Check(ctx)
		c.status = &st
	}
	return *c.status
}

// DumpResult describes a finished dump.
type DumpResult struct {
	Meta     Meta
	Duration time.Duration // wall time of the checkpoint call (containerd + shim + runc + CRIU)
	Stats    DumpStats     // CRIU's own account, from stats-dump
	Size     int64         // bytes in the images directory
}

// Dump checkpoints the running task of container id into dir (created if missing, must be
// empty) and leaves the task running. If the task is paused (cgroup frozen) when Dump is
// called it stays paused, so a caller can freeze, dump, capture the rootfs and thaw; otherwise
// containerd pauses it for the dump and resumes it after. dir also receives CRIU's dump.log,
// stats-dump and MetaFile. Shapes CRIU would dump but not restore, or fail to dump obscurely,
// are refused first with ErrFailedPrecondition naming the process (see Precheck).
func (c *Checkpointer) Dump(ctx context.Context, id, dir string) (DumpResult, error) {
	var res DumpResult
	if err := prepareImagesDir(dir); err != nil {
		return res, err
	}
	ctr, task, err := c.loadTask(ctx, id)
	if err != nil {
		return res, err
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return res, fmt.Errorf("spec of container %s: %w", id, err)
	}
	if err := stripLazy(configOfSpec(spec)); err != nil {
		return res, fmt.Errorf("dump container %s: CRIU configuration: %w", id, err)
	}
	meta, err := c.dumpMeta(ctx, ctr, spec)
	if err != nil {
		return res, err
	}
	start := time.Now()
	pre, err := Precheck(int(task.Pid()), c.Status(ctx))
	if err != nil {
		return res, fmt.Errorf("dump container %s: %w", id, err)
	}
	meta.LoopbackTCPOnly = pre.LoopbackTCPOnly
	wasPaused := false
	if st, err := task.Status(ctx); err == nil {
		wasPaused = st.Status == containerd.Paused
	}
	dctx, cancel := context.WithTimeout(ctx, c.dumpTimeout)
	_, err = task.Checkpoint(dctx, containerd.WithCheckpointImagePath(dir), withCheckpointWorkPath(dir))
	expired := errors.Is(dctx.Err(), context.DeadlineExceeded)
	if err != nil && !expired && strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		// The shim's copy of the deadline (carried by gRPC, as time left) can pass a moment
		// before this one, and its error comes back as text: wait for this one to pass too
		// (it is imminent), so that the stopped dump is cleaned up as one.
		select {
		case <-dctx.Done():
			expired = errors.Is(dctx.Err(), context.DeadlineExceeded)
		case <-time.After(100 * time.Millisecond):
		}
	}
	cancel()
	res.Duration = time.Since(start)
	if err != nil && expired && ctx.Err() == nil {
		return res, c.stoppedDump(ctx, id, dir, meta.CgroupsPath, wasPaused, err)
	}
	if err != nil {
		return res, dumpError(id, dir, err)
	}
	if err := rearmExpiredTimers(dir); err != nil {
		return res, fmt.Errorf("dump container %s: %w", id, err)
	}
	if err := WriteMeta(dir, meta); err != nil {
		return res, err
	}
	res.Meta = meta
	res.Stats, _ = ReadDumpStats(dir)
	res.Size, _ = dirSize(dir)
	log.L(ctx).Debug("criu dump", "container", id, "dir", dir, "ms", res.Duration.Milliseconds(),
		"frozen_ms", res.Stats.Frozen.Milliseconds(), "bytes", res.Size)
	return res, nil
}

func (c *Checkpointer) loadTask(ctx context.Context, id string) (containerd.Container, containerd.Task, error) {
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, nil, fmt.Errorf("load container %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("task of container %s: %w", id, err)
	}
	return ctr, task, nil
}

func (c *Checkpointer) dumpMeta(ctx context.Context, ctr containerd.Container, spec *specs.Spec) (Meta, error) {
	m := LocalMeta(c.Status(ctx))
	m.ContainerID = ctr.ID()
	if spec.Linux != nil {
		m.CgroupsPath = spec.Linux.CgroupsPath
	}
	return m, nil
}

// withCheckpointWorkPath keeps CRIU's work files (dump.log) in path; without it the shim
// uses a temporary directory and deletes it, log included.
func withCheckpointWorkPath(path string) containerd.CheckpointTaskOpts {
	return func(r *containerd.CheckpointTaskInfo) error {
		opts, ok := r.Options.(*options.CheckpointOptions)
		if !ok {
			return fmt.Errorf("checkpoint options are %T, want runc options: %w", r.Options, errdefs.ErrNotImplemented)
		}
		opts.WorkPath = path
		return nil
	}
}

// prepareImagesDir creates dir and refuses one that already holds files.
func prepareImagesDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("criu images dir %q must be absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create criu images dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read criu images dir: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("criu images dir %s is not empty: %w", dir, errdefs.ErrAlreadyExists)
	}
	return nil
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return n, err
}

// stoppedDump cleans up after a dump that ran past the timeout. The shim killed runc when
// the call's deadline passed; CRIU, left behind, must not be killed (it may have its parasite
// code inside the sandbox's processes, which only CRIU can take out again): losing runc, it
// fails its next exchange with it, cures the processes and exits. stoppedDump waits for that
// (dumperExitWait), then thaws the cgroup CRIU froze itself, unless the caller had paused the
// task. A CRIU still running after the wait is named in the error.
func (c *Checkpointer) stoppedDump(ctx context.Context, id, dir, cgroupsPath string, wasPaused bool, cause error) error {
	deadline := time.Now().Add(dumperExitWait)
	left := dumpersOf(dir)
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		left = dumpersOf(dir)
	}
	if len(left) > 0 {
		return fmt.Errorf("dump container %s: the CRIU dump did not finish in %s and its CRIU (pids %v) still runs %s later; the sandbox may stay frozen (%v): %w",
			id, c.dumpTimeout, left, dumperExitWait, cause, context.DeadlineExceeded)
	}
	if !wasPaused {
		if err := thawCgroup(cgroupsPath); err != nil {
			log.L(ctx).Warn("thaw task after a timed-out dump", "container", id, "error", err)
		}
	}
	return fmt.Errorf("dump container %s: the CRIU dump did not finish in %s and was stopped (%v): %w",
		id, c.dumpTimeout, cause, context.DeadlineExceeded)
}

// dumperExitWait bounds the wait for a stopped dump's CRIU to exit.
const dumperExitWait = 30 * time.Second

// dumpersOf returns the criu processes that hold a file under dir open. It matches on the
// process name and the open file, never on a pid alone, and reads only the host's /proc.
func dumpersOf(dir string) []int {
	var pids []int
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) == "criu" && holdsUnder(pid, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// holdsUnder reports whether process pid has a file under dir open.
func holdsUnder(pid int, dir string) bool {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err == nil && (target == filepath.Clean(dir) || strings.HasPrefix(target, prefix)) {
			return true
		}
	}
	return false
}

// thawCgroup thaws the freezer of the cgroup at cgroupsPath (a spec's Linux.CgroupsPath);
// thawing a thawed cgroup is a no-op. pool.Freezer does the same for the pools; this package
// does not depend on them.
func thawCgroup(cgroupsPath string) error {
	if cgroupsPath == "" {
		return nil
	}
	file, val := filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath, "freezer.state"), "THAWED"
	if cgroups.Mode() == cgroups.Unified {
		file, val = filepath.Join("/sys/fs/cgroup", cgroupsPath, "cgroup.freeze"), "0"
	}
	if err := os.WriteFile(file, []byte(val), 0); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("thaw %s: %w", file, err)
	}
	return nil
}
