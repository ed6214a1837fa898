//go:build linux

package criu

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// Checkpointer dumps running containerd tasks to CRIU images directories and restores tasks
// from them, through containerd's runc shim (which runs runc, which runs CRIU).
type Checkpointer struct {
	client   *containerd.Client
	criuPath string
	workRoot string

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

// New returns a Checkpointer using client, whose context must carry the containerd namespace.
func New(client *containerd.Client, opts ...Opt) *Checkpointer {
	c := &Checkpointer{client: client, criuPath: "criu"}
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
	meta, err := c.dumpMeta(ctx, ctr)
	if err != nil {
		return res, err
	}
	start := time.Now()
	pre, err := Precheck(int(task.Pid()), c.Status(ctx))
	if err != nil {
		return res, fmt.Errorf("dump container %s: %w", id, err)
	}
	meta.LoopbackTCPOnly = pre.LoopbackTCPOnly
	_, err = task.Checkpoint(ctx, containerd.WithCheckpointImagePath(dir), withCheckpointWorkPath(dir))
	res.Duration = time.Since(start)
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

func (c *Checkpointer) dumpMeta(ctx context.Context, ctr containerd.Container) (Meta, error) {
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return Meta{}, fmt.Errorf("spec of container %s: %w", ctr.ID(), err)
	}
	if err := RefuseUserNamespace("dump container "+ctr.ID(), spec); err != nil {
		return Meta{}, err
	}
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
