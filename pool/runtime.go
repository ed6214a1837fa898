package pool

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/pool/initproto"
	"github.com/deltabox/deltabox/pool/network"
)

// Container labels that mark DeltaBox's containers; reconcile uses them after a restart.
const (
	LabelManaged = "io.deltabox.managed"
	LabelNode    = "io.deltabox.node"
	LabelPool    = "io.deltabox.pool"
)

// Paths inside every sandbox.
const (
	initPath   = "/.deltabox/init"
	runPath    = "/.deltabox/run"
	initSocket = runPath + "/init.sock"
)

// runtime creates and destroys sandbox containers on containerd.
type runtime struct {
	client      *containerd.Client
	snapshotter string
	runtimeName string
	initBin     string // host path of the static deltabox-init
	dir         string // per-container directories live here
	node        string
	net         Network
	specOpts    func(cid, dir string) ([]oci.SpecOpts, error)
	defaults    Limits    // limits of sandboxes whose template sets none
	ids         *idRanges // host id ranges of the sandboxes' user namespaces
}

// Network gives sandboxes their network namespaces (implemented by pool/network).
type Network interface {
	Setup(ctx context.Context, id string, opts ...network.SetupOpt) (network.Attachment, error)
	Lookup(ctx context.Context, id string) (network.Attachment, error)
	Teardown(ctx context.Context, id string) error
	Reconcile(ctx context.Context, keep func(id string) bool) ([]string, error)
	Env() []string // the sandboxes' proxy environment
}

// instance is one created and started sandbox container.
type instance struct {
	cid    string
	pid    uint32 // init's pid on the host
	runDir string
	init   *initproto.Client
	layout Layout
	ip     netip.Addr              // the sandbox's address (zero without a Network)
	ids    *IDMapping              // its user namespace's mapping (nil: none, host ids)
	ref    atomic.Pointer[initRef] // the init held by pidfd and root fd (initref.go)
}

// Layout locates a sandbox's root filesystem layers and cgroup on the host.
type Layout struct {
	Upper  string   // overlay upper dir (read it; never write it while mounted)
	Lower  []string // overlay lower dirs, topmost first
	Cgroup string   // the container's cgroupsPath, e.g. /deltabox/<cid>
	// Folded is the shared fork layer the root filesystem stacks above the image (also
	// Lower[0]; forklower.go): part of the sandbox's files, not of its image. "" for none.
	Folded string
}

// layoutOf reads the overlay dirs of the container's snapshot and its cgroup path.
func (r *runtime) layoutOf(ctx context.Context, c containerd.Container) (Layout, error) {
	var l Layout
	spec, err := c.Spec(ctx)
	if err != nil {
		return l, fmt.Errorf("spec of %s: %w", c.ID(), err)
	}
	if spec.Linux != nil {
		l.Cgroup = spec.Linux.CgroupsPath
	}
	info, err := c.Info(ctx)
	if err != nil {
		return l, fmt.Errorf("info of %s: %w", c.ID(), err)
	}
	mounts, err := r.client.SnapshotService(r.snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return l, fmt.Errorf("snapshot mounts of %s: %w", c.ID(), err)
	}
	for _, m := range mounts {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				l.Upper = v
			} else if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				l.Lower = strings.Split(v, ":")
			}
		}
	}
	if l.Upper == "" || l.Cgroup == "" {
		return l, fmt.Errorf("container %s has no overlay upper dir or cgroup path (snapshotter %s): %w", c.ID(), r.snapshotter, errdefs.ErrFailedPrecondition)
	}
	if id := info.Labels[LabelForkLower]; id != "" {
		if l.Folded, err = forkLowerPath(l.Upper, id); err != nil {
			return l, err
		}
		l.Lower = append([]string{l.Folded}, l.Lower...)
	}
	return l, nil
}

func (r *runtime) containerDir(cid string) string { return filepath.Join(r.dir, cid) }

func (r *runtime) newInstance(cid string, pid uint32) *instance {
	runDir := filepath.Join(r.containerDir(cid), "run")
	inst := &instance{cid: cid, pid: pid, runDir: runDir}
	inst.init = initproto.New(filepath.Join(runDir, "init.sock"), initproto.WithPeerCheck(inst.checkPeer))
	return inst
}

// image returns the image ref, unpacked for the snapshotter; an image containerd does not
// have is pulled from its registry (pull.go); one that cannot be pulled is NotFound.
func (r *runtime) image(ctx context.Context, ref string) (containerd.Image, error) {
	img, err := r.client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		img, err = r.pull(ctx, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("get image %q: %w", ref, err)
	}
	ok, err := img.IsUnpacked(ctx, r.snapshotter)
	if err != nil {
		return nil, fmt.Errorf("check image %q: %w", ref, err)
	}
	if !ok {
		if err := img.Unpack(ctx, r.snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %q: %w", ref, err)
		}
	}
	return img, nil
}

// RestoreFunc starts a task for an existing, task-less sandbox container from saved state (a
// CRIU restore) instead of a fresh init. ioc receives the task's output.
type RestoreFunc func(ctx context.Context, c containerd.Container, layout Layout, ioc cio.Creator) (containerd.Task, error)

// StartFresh is the RestoreFunc of an ordinary start (a new task running the sandbox init),
// for callers that do something before it.
func StartFresh(ctx context.Context, c containerd.Container, l Layout, ioc cio.Creator) (containerd.Task, error) {
	return freshTask(ctx, c, l, ioc)
}

// freshTask starts a new task running the sandbox init.
func freshTask(ctx context.Context, c containerd.Container, _ Layout, ioc cio.Creator) (containerd.Task, error) {
	task, err := c.NewTask(ctx, ioc)
	if err != nil {
		return nil, fmt.Errorf("create task %s: %w", c.ID(), err)
	}
	if err := task.Start(ctx); err != nil {
		return nil, fmt.Errorf("start task %s: %w", c.ID(), err)
	}
	return task, nil
}

// create makes a container for t, starts its task (with start, or a fresh init when nil) and
// waits until init answers.
// A sandbox with a shared fork layer (forkLower, a dir of NewForkLower) stacks it above the
// image's layers.
func (r *runtime) create(ctx context.Context, t *Template, cid string, start RestoreFunc, forkLower string) (_ *instance, retErr error) {
	if start == nil {
		start = freshTask
	}
	var sp spans
	sp.start()
	defer func() {
		if retErr == nil {
			log.L(ctx).Debug("sandbox create spans", append([]any{"container", cid}, sp.fields()...)...)
		}
	}()
	img, err := r.image(ctx, t.Image)
	if err != nil {
		return nil, err
	}
	inst := r.newInstance(cid, 0)
	defer func() {
		if retErr != nil {
			r.cleanup(ctx, cid) // the sandbox's directory, disk image, container and network
		}
	}()
	// The disk is reserved before anything else of the sandbox is written on the state root
	// (reserveDisk); mkfs then runs while the rest is set up.
	disk, err := r.reserveDisk(ctx, cid, t.limits().Over(r.defaults).DiskBytes)
	if err != nil {
		return nil, err
	}
	defer disk.wait() // never leave mkfs behind (runs before the cleanup)
	sp.mark("image_disk")
	if err := r.sandboxFiles(inst); err != nil {
		return nil, err
	}
	if err := r.allocateIDs(t, inst); err != nil {
		return nil, err
	}
	opts, err := r.containerSpec(ctx, img, t, inst)
	if err != nil {
		return nil, err
	}
	sp.mark("ids_spec")
	labels := map[string]string{LabelManaged: "true", LabelNode: r.node, LabelPool: t.Name}
	if forkLower != "" {
		labels[LabelForkLower] = filepath.Base(forkLower)
	}
	c, err := r.client.NewContainer(ctx, cid,
		containerd.WithImage(img),
		containerd.WithSnapshotter(r.snapshotter),
		containerd.WithNewSnapshot(cid, img, inst.snapshotOpts()...),
		containerd.WithRuntime(r.runtimeName, nil),
		containerd.WithNewSpec(opts...),
		containerd.WithContainerLabels(labels))
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", cid, err)
	}
	sp.mark("container")
	if inst.layout, err = r.layoutOf(ctx, c); err != nil {
		return nil, err
	}
	if forkLower != "" && inst.layout.Folded != forkLower {
		return nil, fmt.Errorf("fork layer %s is not next to the snapshots of %s (%s): %w", forkLower, cid, inst.layout.Upper, errdefs.ErrInvalidArgument)
	}
	if c, err = r.withForkLower(ctx, c, inst.layout); err != nil {
		return nil, err
	}
	if err := r.attachDisk(ctx, cid, inst.layout, disk); err != nil {
		return nil, err
	}
	sp.mark("layout_disk")
	task, err := start(ctx, c, inst.layout, r.initLog(cid))
	if err != nil {
		return nil, err
	}
	sp.mark("task")
	inst.pid = task.Pid()
	if err := inst.attach(); err != nil {
		return nil, err
	}
	if err := r.attachNetwork(ctx, inst, netip.Addr{}); err != nil {
		return nil, err
	}
	sp.mark("network")
	if err := r.waitInit(ctx, inst); err != nil {
		inst.ref.Load().retire()
		return nil, err
	}
	sp.mark("init")
	return inst, nil
}

func (r *runtime) initLog(cid string) cio.Creator {
	return cio.LogFile(r.initLogPath(cid))
}

func (r *runtime) initLogPath(cid string) string {
	return filepath.Join(r.containerDir(cid), "init.log")
}

// sandboxFiles makes the sandbox's run directory and its init's log (which the shim would
// create at the task's start, where a full state root would come back as a plain error
// through containerd).
func (r *runtime) sandboxFiles(inst *instance) error {
	if err := os.MkdirAll(inst.runDir, 0o700); err != nil {
		return stateRootFull(fmt.Errorf("create the sandbox's run directory: %w", err))
	}
	f, err := os.OpenFile(r.initLogPath(inst.cid), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return stateRootFull(fmt.Errorf("create the sandbox's init log: %w", err))
	}
	return f.Close()
}

// replaceTask kills a sandbox's task and starts a new one with start (an in-place restore).
func (r *runtime) replaceTask(ctx context.Context, inst *instance, start RestoreFunc) error {
	c, err := r.client.LoadContainer(ctx, inst.cid)
	if err != nil {
		return fmt.Errorf("load container %s: %w", inst.cid, err)
	}
	if err := killTask(ctx, c); err != nil {
		return err
	}
	if c, err = r.withForkLower(ctx, c, inst.layout); err != nil {
		return err
	}
	task, err := start(ctx, c, inst.layout, r.initLog(inst.cid))
	if err != nil {
		return err
	}
	inst.pid = task.Pid()
	if err := inst.attach(); err != nil {
		return err
	}
	if err := r.reattachNetwork(ctx, inst); err != nil {
		return err
	}
	return r.waitInit(ctx, inst)
}

func (r *runtime) waitInit(ctx context.Context, inst *instance) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := inst.init.WaitReady(ctx, 2*time.Millisecond); err != nil {
		logTail, _ := os.ReadFile(r.initLogPath(inst.cid))
		return fmt.Errorf("sandbox init of %s did not answer: %v (init log: %q): %w", inst.cid, err, tail(logTail, 400), errdefs.ErrUnavailable)
	}
	return nil
}

// containerSpec builds the spec options of a new sandbox: the template's, its network
// namespace (set up here) and the caller's extras.
func (r *runtime) containerSpec(ctx context.Context, img containerd.Image, t *Template, inst *instance) ([]oci.SpecOpts, error) {
	opts := r.templateSpec(img, t, inst.cid, inst.runDir)
	if inst.ids != nil {
		// runc makes the user namespace and, inside it, the network namespace; the network
		// is attached once the task runs (attachNetwork).
		opts = append(opts, userNSSpec(*inst.ids)...)
		if r.net != nil {
			opts = append(opts, oci.WithEnv(r.net.Env()))
		}
	} else if r.net != nil {
		att, err := r.net.Setup(ctx, inst.cid)
		if err != nil {
			return nil, fmt.Errorf("network for %s: %w", inst.cid, err)
		}
		inst.ip = att.IP
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: att.NetNSPath}),
			oci.WithEnv(att.Env()))
	}
	if r.specOpts != nil {
		extra, err := r.specOpts(inst.cid, r.containerDir(inst.cid))
		if err != nil { // it writes files of the sandbox (its CRIU config) on the state root
			return nil, stateRootFull(fmt.Errorf("spec of sandbox %s: %w", inst.cid, err))
		}
		opts = append(opts, extra...)
	}
	return opts, nil
}

func (r *runtime) templateSpec(img containerd.Image, t *Template, cid, runDir string) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(initPath, "--socket", initSocket),
		oci.WithHostname(cid),
		oci.WithMounts([]specs.Mount{
			{Destination: initPath, Type: "bind", Source: r.initBin, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
			{Destination: runPath, Type: "bind", Source: runDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		}),
		oci.WithEnv(t.Env),
	}
	opts = append(opts, t.limits().Over(r.defaults).cgroupSpec()...)
	return append(opts, isolationSpec()...)
}

// destroy kills the sandbox's task and deletes its container, snapshot and directory.
// Missing pieces are fine: destroy is used to clean up half-created sandboxes too.
func (r *runtime) destroy(ctx context.Context, cid string) error {
	if err := failpoint.Inject("pool/destroy"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	c, err := r.client.LoadContainer(ctx, cid)
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("load container %s: %w", cid, err)
	}
	if err == nil {
		if err := killTask(ctx, c); err != nil {
			return err
		}
		if err := r.detachDisk(ctx, c); err != nil {
			return err
		}
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete container %s: %w", cid, err)
		}
	}
	if r.net != nil {
		if err := r.net.Teardown(ctx, cid); err != nil {
			return fmt.Errorf("tear down network of %s: %w", cid, err)
		}
	}
	if err := r.unpinUserNS(cid); err != nil {
		return err
	}
	r.ids.release(r.containerDir(cid))
	if err := os.RemoveAll(r.containerDir(cid)); err != nil {
		return fmt.Errorf("remove sandbox dir of %s: %w", cid, err)
	}
	return nil
}

// detachDisk unmounts the disk of a container whose task is gone (none on a container
// without a snapshot, e.g. a half-created one).
func (r *runtime) detachDisk(ctx context.Context, c containerd.Container) error {
	l, err := r.layoutOf(ctx, c)
	if err != nil {
		log.L(ctx).Debug("no layout, so no disk to detach", "container", c.ID(), "error", err)
		return nil
	}
	return detachDisk(l)
}

func (r *runtime) cleanup(ctx context.Context, cid string) {
	if err := r.destroy(ctx, cid); err != nil {
		log.L(ctx).Warn("cleanup of half-created sandbox failed", "container", cid, "error", err)
	}
}

func killTask(ctx context.Context, c containerd.Container) error {
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load task %s: %w", c.ID(), err)
	}
	exitc, err := task.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait task %s: %w", c.ID(), err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill task %s: %w", c.ID(), err)
	}
	select {
	case <-exitc:
	case <-ctx.Done():
		return fmt.Errorf("task %s did not exit: %w", c.ID(), ctx.Err())
	}
	if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete task %s: %w", c.ID(), err)
	}
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
