package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/overlay"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/initproto"
)

// stateFile is the agent state document saved next to an L3 checkpoint's CRIU images.
const stateFile = "state.json"

// criuSpec writes a sandbox's CRIU configuration file (tcp-established for in-place restores,
// file-locks so that processes holding locks can be dumped) and names it on the spec: the
// containerd shim forwards no CRIU options itself.
func (o *Orchestrator) criuSpec(cid, dir string) ([]oci.SpecOpts, error) {
	path := filepath.Join(dir, "criu.conf")
	if err := criu.WriteConfig(path, criu.Options{TCPEstablished: true, FileLocks: true, CgroupYard: o.cgroupYard}); err != nil {
		return nil, err
	}
	return []oci.SpecOpts{criu.WithConfig(path)}, nil
}

// cutL3 is the paused window of an L3 checkpoint: the init parks its listener, containerd
// pauses the task, CRIU dumps its processes (left running), the upper dir is captured in full
// while still paused (CRIU checks file sizes on restore) and the state document saved, then
// the task resumes and the init is unparked.
func (o *Orchestrator) cutL3(ctx context.Context, s *session, level overlay.Level, rec *ckptRecord) (time.Duration, pendingFiles, error) {
	if !o.criu.Available {
		return 0, nil, fmt.Errorf("L3 checkpoints are unavailable on this node: %s: %w", o.criu.Reason, errdefs.ErrFailedPrecondition)
	}
	if ids := s.templateCheckpoints(); len(ids) > 0 {
		return 0, nil, fmt.Errorf("sandbox %q has process templates (checkpoints %v), which CRIU cannot dump (they are traced by the daemon): %w",
			s.id, ids, errdefs.ErrFailedPrecondition)
	}
	dir := filepath.Join(s.dir, "l3", rec.ID)
	if err := os.RemoveAll(dir); err != nil {
		return 0, nil, err
	}
	// The init parks its listener for the dump (see initproto.UnparkSignal) and is unparked
	// after the resume; then containerd's checkpoint expects a task it paused itself (runc
	// pause), not a cgroup frozen behind its back. Both undo steps run even if the request is
	// cancelled.
	followers := o.procs.gate(s.id)
	followers.pause(initParkTimeout) // detached execs run on; their followers come back after
	defer followers.resume()
	if err := parkInit(ctx, s.sb); err != nil {
		return 0, nil, err
	}
	defer unparkInit(ctx, s.sb)
	pause := func(ctx context.Context) error { return o.pools.Pause(ctx, s.id) }
	resume := func(ctx context.Context) error { return o.pools.Resume(ctx, s.id) }
	if err := pauseParked(ctx, pause, resume, func() ([]string, error) { return initSockets(s.sb) }); err != nil {
		return 0, nil, fmt.Errorf("pause %s: %w", s.id, err)
	}
	frozenAt := time.Now()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := o.pools.Resume(rctx, s.id); err != nil {
			log.L(ctx).Error("resume sandbox after L3 dump", "sandbox", s.id, "error", err)
		}
	}()
	dump, err := o.l3.Dump(ctx, s.sb.Container, filepath.Join(dir, "images"))
	if err != nil {
		os.RemoveAll(dir)
		return 0, nil, fmt.Errorf("dump processes of %s: %w", s.id, err)
	}
	rec.Images = dir
	if err := failpoint.Inject("l3/dumped"); err != nil { // still paused
		os.RemoveAll(dir)
		return 0, nil, err
	}
	pending, err := o.capture(ctx, s, level, rec, nil) // files, state seq, watermark, procs
	if err != nil {
		os.RemoveAll(dir)
		return 0, nil, err
	}
	rec.Bytes += dump.Size
	doc, err := s.state.Get("")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, stateFile), doc, 0o600)
	}
	if err != nil {
		pending.Abort()
		os.RemoveAll(dir)
		return 0, nil, err
	}
	log.L(ctx).Info("processes dumped", "sandbox", s.id, "checkpoint", rec.ID, "dump_ms", ms(dump.Duration),
		"criu_frozen_ms", ms(dump.Stats.Frozen), "bytes", dump.Size)
	return time.Since(frozenAt), pending, nil
}

// initParkTimeout bounds the wait for the init to close or reopen its listener.
const initParkTimeout = 2 * time.Second

// parkInit makes the sandbox's init close its listener and waits until the init holds no
// path-bound unix socket: a dumped init that still had its listener could not be restored by
// CRIU 4.1.1 as soon as a daemonized process (a session whose leader exited) is reparented
// to it, and one that still had a connection from the host (an exec's, still closing) could
// not be dumped at all ("connected from outside the sandbox"). An
// init that does not park (one older than parking) is dumped as it is; the dump's pre-check
// refuses the tree if that socket would break the restore.
func parkInit(ctx context.Context, sb pool.Sandbox) error {
	if err := sb.Init().Park(ctx); err != nil {
		if errdefs.IsInvalidArgument(err) { // "unknown op": an init older than parking
			log.L(ctx).Warn("sandbox init cannot park its listener; dumping it listening", "sandbox", sb.ID, "error", err)
			return nil
		}
		return fmt.Errorf("park the init of %s: %w", sb.ID, err)
	}
	deadline := time.Now().Add(initParkTimeout)
	for {
		socks, err := initSockets(sb)
		if err == nil && len(socks) == 0 {
			return nil
		}
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("it still holds %v (its listener or connections from the host) after %s: %w", socks, initParkTimeout, errdefs.ErrUnavailable)
		}
		if err != nil {
			unparkInit(ctx, sb)
			return fmt.Errorf("park the init of %s: %w", sb.ID, err)
		}
		select {
		case <-ctx.Done():
			unparkInit(ctx, sb)
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// initSockets lists the path-bound unix sockets the sandbox's init holds: its listener, and
// the connections it accepted on it (they carry the listener's path, and the host's are in
// the host's network namespace, not the sandbox's: criu.PathUnixSockets). It reads /proc/<pid>,
// so the init's pidfd must show it alive before and after: the pid named the init all along.
func initSockets(sb pool.Sandbox) ([]string, error) {
	if err := sb.Usable(); err != nil {
		return nil, err
	}
	socks, err := criu.PathUnixSockets(int(sb.InitPid))
	if err != nil {
		return nil, err
	}
	if err := sb.Usable(); err != nil {
		return nil, err
	}
	return socks, nil
}

// pauseParked pauses the task once its parked init holds no connection from the host. A
// connection still closing when parkInit looked, or one made after (a parked init can be
// made to listen again), would make CRIU refuse the dump as "connected from outside the
// sandbox". The check runs while the task is paused, when nothing can change any more; if a
// socket is left, the task resumes for a moment (to let the init close it) and is checked
// again, for at most initParkTimeout.
func pauseParked(ctx context.Context, pause, resume func(context.Context) error, sockets func() ([]string, error)) error {
	deadline := time.Now().Add(initParkTimeout)
	for {
		if err := pause(ctx); err != nil {
			return err
		}
		socks, err := sockets()
		if err == nil && len(socks) == 0 {
			return nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		rerr := resume(rctx)
		cancel()
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("the parked init still holds %v (connections from the host) after %s: %w", socks, initParkTimeout, errdefs.ErrUnavailable)
		}
		if err = errors.Join(err, rerr); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// unparkInit makes a (parked or restored) init listen again and waits until it answers.
func unparkInit(ctx context.Context, sb pool.Sandbox) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), initParkTimeout)
	defer cancel()
	if err := sb.SignalInit(initproto.UnparkSignal); err != nil {
		log.L(ctx).Error("unpark sandbox init", "sandbox", sb.ID, "error", err)
		return
	}
	if _, err := sb.Init().WaitReady(ctx, time.Millisecond); err != nil {
		log.L(ctx).Error("unparked sandbox init does not answer", "sandbox", sb.ID, "error", err)
	}
}

// writeNewIdentityConfig writes the CRIU configuration of a restore under a new identity
// (criu.NewIdentityOptions: loopback-only TCP connections stay established, others close).
func (o *Orchestrator) writeNewIdentityConfig(conf, images string) error {
	m, err := criu.ReadMeta(images)
	if err != nil {
		return err
	}
	opts := criu.NewIdentityOptions(m)
	opts.CgroupYard = o.cgroupYard
	return criu.WriteConfig(conf, opts)
}

// restoreL3 restores a task from CRIU images and unparks its init, which was parked when
// the images were dumped; the pool then waits for the init to answer.
func (o *Orchestrator) restoreL3(ctx context.Context, cid, images string, ioc cio.Creator) (containerd.Task, error) {
	t, err := o.l3.Restore(ctx, cid, images, ioc)
	if err != nil {
		return nil, err
	}
	if err := t.Kill(ctx, initproto.UnparkSignal); err != nil { // the pool's wait for the init reports it
		log.L(ctx).Error("unpark the restored init", "container", cid, "error", err)
	}
	return t, nil
}

// removeImages deletes an L3 checkpoint's CRIU images.
func removeImages(c ckptRecord) {
	if c.Images != "" {
		_ = os.RemoveAll(c.Images)
	}
}

// restoreProcesses finishes an in-place rollback to an L3 checkpoint: files, state and effects
// are back at the checkpoint and the sandbox is frozen; every process is killed and the task is
// restored from the checkpoint's CRIU images under the same ID and network identity.
func (o *Orchestrator) restoreProcesses(ctx context.Context, s *session, target ckptRecord) error {
	// The followers of detached execs attach again to the restored init: an exec the
	// checkpoint holds goes on being followed, one started after it ends as lost.
	followers := o.procs.gate(s.id)
	followers.pause(initParkTimeout)
	defer followers.resume()
	procs, err := s.frz.Procs()
	if err != nil {
		return err
	}
	var pids []int
	for _, p := range procs {
		if p.Pid != int(s.sb.InitPid) { // the task replacement stops the init, expectedly
			pids = append(pids, p.Pid)
		}
	}
	s.frz.Kill(pids) // through pidfds of cgroup members: a reused pid is never signalled
	if err := o.thaw(ctx, s); err != nil {
		return err
	}
	images := filepath.Join(target.Images, "images")
	sb, err := o.pools.ReplaceTask(ctx, s.id, func(ctx context.Context, c containerd.Container, _ pool.Layout, ioc cio.Creator) (containerd.Task, error) {
		return o.restoreWithTimeout(ctx, c.ID(), images, ioc)
	})
	if err != nil {
		return fmt.Errorf("restore processes of checkpoint %s: %w", target.ID, err)
	}
	s.sb = sb
	return nil
}

// savedState reads the state document saved with an L3 checkpoint.
func savedState(dir string) (json.RawMessage, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("state of L3 checkpoint: %w", err)
	}
	return data, nil
}
