package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// A sandbox's user namespace is made before its container, by a holder process (the init
// binary with --hold) started in a new user namespace with the sandbox's mapping and a new
// network namespace, which is therefore owned by the user namespace. The user namespace is
// pinned in the sandbox's directory and the container joins it by path (runc joins the user
// namespace first, then the network namespace the network pinned from the holder); the holder
// then exits, and once the task runs the pin is dropped (the init holds the namespace; runc
// execs through /proc/<init>/ns). Had runc made the user namespace, a network namespace made on the host for CNI
// would belong to the host's user namespace, and CRIU refuses to dump such a container.

const userNSFile = "userns" // in the sandbox's directory

func (r *runtime) userNSPath(cid string) string {
	return filepath.Join(r.containerDir(cid), userNSFile)
}

// nsHolder is a process that holds a new user and network namespace until stop.
type nsHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startHolder starts the init binary with --hold in a new user namespace mapping m and a new
// network namespace. The binary is run through an fd opened here (/proc/self/fd/3 in the
// child), so its host path need not be searchable by the unprivileged ids of the namespace.
func startHolder(initBin string, m IDMapping) (*nsHolder, error) {
	bin, err := os.Open(initBin)
	if err != nil {
		return nil, fmt.Errorf("open init binary: %w", err)
	}
	defer bin.Close()
	cmd := exec.Command("/proc/self/fd/3", "--hold")
	cmd.ExtraFiles = []*os.File{bin}
	maps := []syscall.SysProcIDMap{{ContainerID: int(m.ContainerID), HostID: int(m.HostID), Size: int(m.Size)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: maps, GidMappings: maps,
		GidMappingsEnableSetgroups: true, // the sandbox's processes may call setgroups(2)
		// no Pdeathsig: it fires when the starting OS thread exits; stdin closes with us
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		stdin.Close()
		return nil, fmt.Errorf("start user namespace holder: %w", err)
	}
	return &nsHolder{cmd: cmd, stdin: stdin}, nil
}

func (h *nsHolder) pid() int { return h.cmd.Process.Pid }

// stop ends the holder and reaps it (the namespaces live on where they are pinned).
func (h *nsHolder) stop() {
	if h == nil {
		return
	}
	h.stdin.Close()
	t := time.AfterFunc(5*time.Second, func() { _ = h.cmd.Process.Kill() })
	defer t.Stop()
	_ = h.cmd.Wait()
}

// makeUserNS starts the holder of a new sandbox's namespaces and pins its user namespace.
func (r *runtime) makeUserNS(cid string, m IDMapping) (*nsHolder, error) {
	h, err := startHolder(r.initBin, m)
	if err != nil {
		return nil, err
	}
	if err := pinNS(fmt.Sprintf("/proc/%d/ns/user", h.pid()), r.userNSPath(cid)); err != nil {
		h.stop()
		return nil, err
	}
	return h, nil
}

// pinNS bind-mounts the namespace file from onto a new file at path.
func pinNS(from, path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create namespace file: %w", err)
	}
	f.Close()
	if err := unix.Mount(from, path, "none", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("pin namespace %s at %s: %w", from, path, err)
	}
	return nil
}

// unpinUserNS unmounts and removes a sandbox's pinned user namespace; none is fine.
func (r *runtime) unpinUserNS(cid string) error {
	path := r.userNSPath(cid)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount user namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove user namespace %s: %w", path, err)
	}
	return nil
}

// userNSSpec makes the container join its pinned user namespace, with its mapping in the
// spec (runc checks that they agree).
func userNSSpec(path string, m IDMapping) []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithUserNamespace(m.specMaps(), m.specMaps()),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.UserNamespace, Path: path}),
	}
}

// unpinOrphanUserNS drops the user namespace pins of sandbox directories whose container does
// not exist (a daemon killed between making the namespace and creating the container).
func (r *runtime) unpinOrphanUserNS(ctx context.Context) {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, err := os.Lstat(r.userNSPath(e.Name())); err != nil {
			continue
		}
		if _, err := r.client.LoadContainer(ctx, e.Name()); !errdefs.IsNotFound(err) {
			continue
		}
		if err := r.unpinUserNS(e.Name()); err != nil {
			log.L(ctx).Warn("drop the user namespace of a vanished sandbox", "container", e.Name(), "error", err)
		}
	}
}
