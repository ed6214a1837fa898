//go:build linux

package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
)

// Restore creates and starts a task for container id from the CRIU images in dir and returns
// it running. The container must exist without a task and its rootfs must already hold the
// files the dumped processes had open, with the same sizes (in place: the rootfs as it was at
// dump time; under a new ID: a snapshot of the same image with the dump's rootfs diff
// applied). A container other than the dumped one must have its own cgroupsPath (containerd's
// default spec gives /<namespace>/<id>); Restore refuses one that reuses the dumped
// container's. The CRIU options of the restore come from the configuration file named by the
// container's ConfigAnnotation (see WriteConfig): tcp-close for a new identity.
func (c *Checkpointer) Restore(ctx context.Context, id, dir string, ioc cio.Creator) (containerd.Task, error) {
	ctr, spec, err := c.restoreTarget(ctx, id, dir)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(c.workRoot, "criu-restore-"+id+"-")
	if err != nil {
		return nil, fmt.Errorf("restore container %s: work dir: %w", id, err)
	}
	start := time.Now()
	lazy, undo := c.lazyRestore(ctx, ctr, spec, dir, work)
	// containerd's runc shim runs `runc restore` (and so CRIU) in Start, not in NewTask: the
	// configuration goes back once Start returned.
	undoConfig := func() {
		if undo != nil {
			if uerr := undo(); uerr != nil {
				log.L(ctx).Error("put back the CRIU configuration after a lazy restore", "container", id, "error", uerr)
			}
			undo = nil
		}
	}
	defer undoConfig()
	task, err := ctr.NewTask(ctx, ioc, containerd.WithRestoreImagePath(dir), containerd.WithRestoreWorkPath(work))
	if err != nil {
		if lazy != nil {
			lazy.stop()
		}
		c.deleteLeftTask(ctx, ctr) // a restore cut short by ctx may have made the task anyway
		return nil, restoreError(id, work, timedOut(ctx, err))
	}
	err = failpoint.Inject("criu/restore-created")
	if err == nil {
		err = ctx.Err()
	}
	if err == nil {
		err = task.Start(ctx)
	}
	undoConfig()
	if err != nil {
		if lazy != nil {
			lazy.stop()
		}
		c.deleteTask(ctx, task)
		return nil, restoreError(id, work, timedOut(ctx, err))
	}
	if lazy != nil {
		kill, release, kerr := killInit(task.Pid())
		if kerr != nil { // the init is gone already: nothing runs with missing memory
			kill, release = func() error { return nil }, func() {}
			log.L(ctx).Warn("lazy restore", "container", id, "error", kerr)
		}
		lazy.watch(ctx, id, kill, release) // removes work once the page server is done
	} else {
		os.RemoveAll(work)
	}
	log.L(ctx).Debug("criu restore", "container", id, "dir", dir, "ms", time.Since(start).Milliseconds(), "pid", task.Pid(), "lazy", lazy != nil)
	return task, nil
}

// lazyRestore starts a page server for a restore where lazy restores are on and usable
// (LazyUsable), and switches the container's CRIU configuration to lazy pages, returning the
// server and the configuration's undo; nil, nil for an eager restore (any failure to set up a
// lazy one is logged and falls back to it).
func (c *Checkpointer) lazyRestore(ctx context.Context, ctr containerd.Container, spec *specs.Spec, dir, work string) (*lazyServer, func() error) {
	if !c.lazy {
		return nil, nil
	}
	if ok, why := LazyUsable(spec); !ok {
		log.L(ctx).Debug("criu restore is eager", "container", ctr.ID(), "reason", why)
		return nil, nil
	}
	lazy, err := c.startLazy(ctx, dir, work)
	if err != nil {
		log.L(ctx).Warn("criu restore is eager: no page server", "container", ctr.ID(), "error", err)
		return nil, nil
	}
	undo, err := lazyConfig(ctx, ctr)
	if err != nil {
		lazy.stop()
		log.L(ctx).Warn("criu restore is eager: CRIU configuration", "container", ctr.ID(), "error", err)
		return nil, nil
	}
	c.lazyRestores.Add(1)
	return lazy, undo
}

// LazyRestores counts the restores that were lazy.
func (c *Checkpointer) LazyRestores() int64 { return c.lazyRestores.Load() }

// restoreTarget checks the images against this node and the container (compatibility,
// cgroup, file locks, and that no process gains privileges the container's spec does not
// grant), and loads it.
func (c *Checkpointer) restoreTarget(ctx context.Context, id, dir string) (containerd.Container, *specs.Spec, error) {
	meta, err := ReadMeta(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("restore container %s: %w", id, err)
	}
	if err := CheckCompatible(meta, c.Status(ctx)); err != nil {
		return nil, nil, fmt.Errorf("restore container %s: %w", id, err)
	}
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, nil, fmt.Errorf("restore: load container %s: %w", id, err)
	}
	if _, err := ctr.Task(ctx, nil); err == nil {
		return nil, nil, fmt.Errorf("restore container %s: it still has a task (kill and delete it first): %w", id, errdefs.ErrFailedPrecondition)
	} else if !errdefs.IsNotFound(err) {
		return nil, nil, fmt.Errorf("restore container %s: %w", id, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("spec of container %s: %w", id, err)
	}
	if err := CheckUserNS(dir, spec); err != nil {
		return nil, nil, fmt.Errorf("restore container %s: %w", id, err)
	}
	m, err := SpecMapping(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("restore container %s: %w", id, err)
	}
	if err := ShareImages(dir, m); err != nil {
		return nil, nil, fmt.Errorf("restore container %s: images for its user namespace: %w", id, err)
	}
	if err := checkCgroup(ctr, spec, meta); err != nil {
		return nil, nil, err
	}
	if err := CheckCreds(dir, spec); err != nil {
		return nil, nil, fmt.Errorf("restore container %s: %w", id, err)
	}
	if err := checkFileLocks(ctx, ctr, dir); err != nil {
		return nil, nil, err
	}
	return ctr, spec, nil
}

// checkCgroup refuses to restore images under a new container ID into the dumped container's
// cgroup: both would share limits, accounting and the freezer.
func checkCgroup(ctr containerd.Container, spec *specs.Spec, meta Meta) error {
	if meta.ContainerID == "" || meta.ContainerID == ctr.ID() {
		return nil
	}
	if spec.Linux != nil && spec.Linux.CgroupsPath == meta.CgroupsPath {
		return fmt.Errorf("restore container %s: its cgroupsPath %q is the one of dumped container %s; a restore under a new ID needs its own cgroup (oci.WithCgroup): %w",
			ctr.ID(), meta.CgroupsPath, meta.ContainerID, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// timedOut names a restore that ran past ctx's deadline (the caller's restore timeout).
func timedOut(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the CRIU restore did not finish in time and was stopped (%v): %w", err, context.DeadlineExceeded)
	}
	return err
}

// deleteLeftTask removes the task of ctr, if a failed NewTask left one.
func (c *Checkpointer) deleteLeftTask(ctx context.Context, ctr containerd.Container) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if task, err := ctr.Task(dctx, nil); err == nil {
		c.deleteTask(dctx, task)
	}
}

// deleteTask removes a task whose restore failed; it survives cancellation of ctx.
func (c *Checkpointer) deleteTask(ctx context.Context, task containerd.Task) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
		log.L(ctx).Warn("delete task after failed restore", "container", task.ID(), "error", err)
	}
}

// fileLocksImage is CRIU's image of the file locks of the dumped processes; it holds only its
// 8-byte magic header when there were none.
const fileLocksImage = "filelocks.img"

// checkFileLocks refuses images holding file locks when the container's CRIU configuration
// lacks file-locks: CRIU would restore the processes without their locks, silently.
func checkFileLocks(ctx context.Context, ctr containerd.Container, dir string) error {
	info, err := os.Stat(filepath.Join(dir, fileLocksImage))
	if err != nil || info.Size() <= 8 {
		return nil
	}
	conf, err := ConfigOf(ctx, ctr)
	if err != nil {
		return err
	}
	if conf != "" && configHas(conf, "file-locks") {
		return nil
	}
	return fmt.Errorf("restore container %s: the images hold file locks but its CRIU config %q does not enable file-locks (the locks would be dropped silently; see WriteConfig): %w",
		ctr.ID(), conf, errdefs.ErrFailedPrecondition)
}

// configHas reports whether the CRIU configuration file at path sets option.
func configHas(path, option string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.TrimLeft(f[0], "-") == option {
			return true
		}
	}
	return false
}
