package pool

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/tmpfs"
)

// Fork lowers: a checkpoint shared by several new sandboxes as a read-only overlay layer
// (fork --from). The orchestrator asks for a layer directory (NewForkLower), writes the
// checkpoint into it (overlay.Store.WriteLower) and leases sandboxes with
// LeaseRequest.SharedLower: each is a new container whose root filesystem is the image's
// layers with the shared layer on top and an empty upper dir of its own, so nothing of the
// image or of the checkpoint is copied per sandbox.
//
// The layers live under the snapshotter's root, next to its snapshots: containerd idmaps the
// common parent of a root filesystem's lower dirs once for a user-namespaced sandbox, so the
// shared layer must share a parent with the image's layers. A layer that fits goes to
// <root>/deltabox-forklowers/flm-<id>, a tmpfs (Options.ForkLowerMemory, mounted by the
// first daemon that needs it, shared by the daemons of the host): creating thousands of small
// files there costs a tenth of what it costs on the snapshotter's disk filesystem, and the
// layer is derived data, never the only copy. Others go to
// <root>/deltabox-forklowers-disk/fld-<id>.
// A layer holds the sandbox's own ids (0..65535), as the image's layers do. Each container
// using one carries the label io.deltabox.forklower=<id>; the layers are listed in
// <pool root>/forklowers.list. A layer is removed when no container carries its label and no
// lease is being made with it (the last of its sandboxes was destroyed, or its fork failed),
// and at start for every listed layer no container uses. Such sandboxes are destroyed on
// release, never returned to the warm pool: their root filesystem is not the pool's.

// LabelForkLower names the shared fork layer a container's root filesystem stacks.
const LabelForkLower = "io.deltabox.forklower"

const (
	forkLowersDir     = "deltabox-forklowers"      // a tmpfs: flm-<id>
	forkLowersDiskDir = "deltabox-forklowers-disk" // on the snapshotter's filesystem: fld-<id>
	forkLowersList    = "forklowers.list"
	// DefaultForkLowerMemory bounds the tmpfs of in-memory fork layers.
	DefaultForkLowerMemory = 1 << 30
)

// snapshotterRoot returns the overlay snapshotter's root of an upper dir
// (<root>/snapshots/<n>/fs).
func snapshotterRoot(upper string) (string, error) {
	snaps := filepath.Dir(filepath.Dir(upper))
	if filepath.Base(upper) != "fs" || filepath.Base(snaps) != "snapshots" {
		return "", fmt.Errorf("upper dir %s is not an overlay snapshot's (<root>/snapshots/N/fs): %w", upper, errdefs.ErrNotImplemented)
	}
	return filepath.Dir(snaps), nil
}

// forkLowerPath is the directory of shared layer id next to upper's snapshots.
func forkLowerPath(upper, id string) (string, error) {
	root, err := snapshotterRoot(upper)
	if err != nil {
		return "", err
	}
	switch {
	case strings.HasPrefix(id, "flm-"):
		return filepath.Join(root, forkLowersDir, id), nil
	case strings.HasPrefix(id, "fld-"):
		return filepath.Join(root, forkLowersDiskDir, id), nil
	}
	return "", fmt.Errorf("fork layer id %q: %w", id, errdefs.ErrInvalidArgument)
}

// NewForkLower reserves a directory for a layer shared by forks of sandbox src (next to its
// snapshots; not created: the caller writes it) and lists it: in memory when size (the
// layer's estimated footprint) fits the in-memory area's free space, else on disk. The layer
// is held (never removed) until ReleaseForkLower: lease the forks in between.
func (m *Manager) NewForkLower(ctx context.Context, src Sandbox, size int64) (string, error) {
	root, err := snapshotterRoot(src.Layout.Upper)
	if err != nil {
		return "", err
	}
	id := newID("fld-")
	if m.inMemory(ctx, root, size) {
		id = "flm-" + strings.TrimPrefix(id, "fld-")
	}
	dir, err := forkLowerPath(src.Layout.Upper, id)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", fmt.Errorf("fork layers dir: %w", err)
	}
	m.flMu.Lock()
	defer m.flMu.Unlock()
	list, err := m.readForkLowers()
	if err != nil {
		return "", err
	}
	if err := m.writeForkLowers(append(list, dir)); err != nil {
		return "", err
	}
	m.flPins[dir]++
	return dir, nil
}

// HoldForkLower holds a layer of NewForkLower again, for more forks on it, when it still
// exists (some sandbox uses it or a hold is taken); false when it was removed or is going.
func (m *Manager) HoldForkLower(dir string) bool {
	m.flMu.Lock()
	defer m.flMu.Unlock()
	list, err := m.readForkLowers()
	if err != nil || !slices.Contains(list, dir) {
		return false
	}
	if _, err := os.Stat(dir); err != nil {
		return false
	}
	m.flPins[dir]++
	return true
}

// ReleaseForkLower ends NewForkLower's (or HoldForkLower's) hold; the layer is removed when no sandbox uses it.
func (m *Manager) ReleaseForkLower(ctx context.Context, dir string) {
	m.flMu.Lock()
	defer m.flMu.Unlock()
	if m.flPins[dir]--; m.flPins[dir] <= 0 {
		delete(m.flPins, dir)
	}
	m.dropForkLowerLocked(ctx, dir)
}

// dropForkLower removes a shared layer once nothing uses it (after a sandbox was destroyed).
func (m *Manager) dropForkLower(ctx context.Context, dir string) {
	if dir == "" {
		return
	}
	m.flMu.Lock()
	defer m.flMu.Unlock()
	m.dropForkLowerLocked(ctx, dir)
}

func (m *Manager) dropForkLowerLocked(ctx context.Context, dir string) {
	if m.flPins[dir] > 0 {
		return
	}
	filter := fmt.Sprintf(`labels.%q==%s`, LabelForkLower, filepath.Base(dir))
	cs, err := m.rt.client.Containers(ctx, filter)
	if err != nil {
		log.L(ctx).Warn("list the sandboxes of a fork layer (kept)", "layer", dir, "error", err)
		return
	}
	if len(cs) > 0 {
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		log.L(ctx).Warn("remove a fork layer no sandbox uses", "layer", dir, "error", err)
		return
	}
	list, err := m.readForkLowers()
	if err == nil {
		err = m.writeForkLowers(slices.DeleteFunc(list, func(d string) bool { return d == dir }))
	}
	if err != nil {
		log.L(ctx).Warn("unlist a removed fork layer", "layer", dir, "error", err)
	}
	log.L(ctx).Info("fork layer removed: no sandbox uses it", "layer", dir)
}

// pruneForkLowers removes the listed layers no container uses (at start, after reconcile).
func (m *Manager) pruneForkLowers(ctx context.Context) {
	m.flMu.Lock()
	list, err := m.readForkLowers()
	m.flMu.Unlock()
	if err != nil {
		log.L(ctx).Warn("read the fork layers list", "error", err)
		return
	}
	for _, dir := range list {
		m.dropForkLower(ctx, dir)
	}
}

// inMemory says whether a layer of size bytes goes to the in-memory area under root, mounting
// its tmpfs first if needed (under a host-wide lock: daemons of the host share it).
func (m *Manager) inMemory(ctx context.Context, root string, size int64) bool {
	limit := m.opts.ForkLowerMemory
	if limit < 0 || size > limit/2 {
		return false
	}
	dir := filepath.Join(root, forkLowersDir)
	if err := mountForkTmpfs(root, dir, limit); err != nil {
		log.L(ctx).Warn("in-memory fork layers unavailable: layers go to disk", "dir", dir, "error", err)
		return false
	}
	free, err := tmpfs.Free(dir)
	return err == nil && free >= 2*size // room for writes under way
}

// mountForkTmpfs mounts a tmpfs of limit bytes on dir unless one is there, under a lock on
// root the daemons of the host share.
func mountForkTmpfs(root, dir string, limit int64) error {
	lock, err := os.OpenFile(filepath.Join(root, forkLowersDir+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	return tmpfs.Ensure(dir, limit, 0, false) // the layers hold the sandbox's programs: exec stays
}

// ForkLowers lists the shared fork layers (for tests and operators).
func (m *Manager) ForkLowers() ([]string, error) {
	m.flMu.Lock()
	defer m.flMu.Unlock()
	return m.readForkLowers()
}

func (m *Manager) forkLowersFile() string { return filepath.Join(m.opts.Root, forkLowersList) }

// readForkLowers reads the list (absolute paths, one per line). flMu is held.
func (m *Manager) readForkLowers() ([]string, error) {
	f, err := os.Open(m.forkLowersFile())
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		// Only what NewForkLower writes: an absolute path ending in
		// .../deltabox-forklowers/flm-* or .../deltabox-forklowers-disk/fld-*.
		parent, base := filepath.Base(filepath.Dir(line)), filepath.Base(line)
		ok := parent == forkLowersDir && strings.HasPrefix(base, "flm-") ||
			parent == forkLowersDiskDir && strings.HasPrefix(base, "fld-")
		if ok && filepath.IsAbs(line) && filepath.Clean(line) == line {
			out = append(out, line)
		}
	}
	return out, sc.Err()
}

// writeForkLowers replaces the list (written to a temp file, synced and renamed). flMu is held.
func (m *Manager) writeForkLowers(list []string) error {
	tmp := m.forkLowersFile() + ".tmp"
	var b strings.Builder
	for _, d := range list {
		b.WriteString(d + "\n")
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(b.String())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, m.forkLowersFile())
	}
	if err != nil {
		return fmt.Errorf("write the fork layers list: %w", err)
	}
	return nil
}

// forkRootfs wraps a container whose root filesystem stacks a shared fork layer so that its
// tasks mount the snapshot's overlay with that layer on top of the image's (Layout.Lower
// already has it first).
type forkRootfs struct {
	containerd.Container
	rootfs []mount.Mount
}

// NewTask creates the task with the stacked root filesystem.
func (c forkRootfs) NewTask(ctx context.Context, ioc cio.Creator, opts ...containerd.NewTaskOpts) (containerd.Task, error) {
	return c.Container.NewTask(ctx, ioc, append([]containerd.NewTaskOpts{containerd.WithRootFS(c.rootfs)}, opts...)...)
}

// withForkLower returns c wrapped by forkRootfs when its layout stacks a fork layer, else c.
func (r *runtime) withForkLower(ctx context.Context, c containerd.Container, l Layout) (containerd.Container, error) {
	if l.Folded == "" {
		return c, nil
	}
	mounts, err := r.stackedMounts(ctx, c, l.Folded)
	if err != nil {
		return nil, err
	}
	return forkRootfs{Container: c, rootfs: mounts}, nil
}

// stackedMounts returns the mounts of c's root filesystem with the fork layer folded stacked
// above the image's layers.
func (r *runtime) stackedMounts(ctx context.Context, c containerd.Container, folded string) ([]mount.Mount, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("info of %s: %w", c.ID(), err)
	}
	mounts, err := r.client.SnapshotService(r.snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return nil, fmt.Errorf("snapshot mounts of %s: %w", c.ID(), err)
	}
	stacked := false
	for i, m := range mounts {
		opts := slices.Clone(m.Options)
		for j, o := range opts {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				opts[j] = "lowerdir=" + folded + ":" + v
				stacked = true
			}
		}
		mounts[i].Options = opts
	}
	if !stacked {
		return nil, fmt.Errorf("container %s: its snapshot has no overlay lower dirs to stack a fork layer on: %w", c.ID(), errdefs.ErrFailedPrecondition)
	}
	return mounts, nil
}
