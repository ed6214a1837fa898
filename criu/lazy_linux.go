//go:build linux

package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// Lazy restores. An eager CRIU restore copies every dumped page into the new processes before
// they run: for a process with 50 MiB of heap that preadv is most of the restore (~380 ms of a
// 600 ms restore on a machine where a first touch of a page costs ~30 us). With lazy pages the
// processes run as soon as everything but their anonymous memory is back, and a second CRIU,
// `criu lazy-pages`, fills that memory through userfaultfd: pages a process touches first are
// served first, the rest are pushed in the background, and the server exits once every page is
// in.
//
// containerd's runc shim has no lazy-pages option on restore, so it is switched on the way the
// other options the shim does not forward are (WriteConfig): the container's CRIU configuration
// file gets "lazy-pages" for the restore and loses it right after. A dump must never see it (a
// lazy dump waits for a page server): Dump strips it first if a daemon killed mid-restore left
// it there (stripLazy).
//
// The restored processes make the userfaultfd themselves, before their credentials are set
// back: in a user namespace of their own that needs vm.unprivileged_userfaultfd=1 (the kernel
// asks for CAP_SYS_PTRACE in the host's namespace otherwise), so LazyUsable says no there
// unless the host allows it. The sandbox's own seccomp profile still refuses userfaultfd to
// what runs inside.
//
// A page server that fails leaves the processes with memory that is not theirs (the kernel
// fills pages of a closed userfaultfd with zeroes): the restored task is killed then, which
// fences its sandbox, and the failure is logged with the server's log.

// lazyOption is the CRIU configuration line that makes a restore lazy.
const lazyOption = "lazy-pages"

// lazySocket is the socket `criu lazy-pages` listens on, in its work directory; the restoring
// CRIU connects to it from its own work directory (the same one).
const lazySocket = "lazy-pages.socket"

// LazyLog is the page server's log, in the restore's work directory.
const LazyLog = "lazy-pages.log"

// lazyTimeout bounds one page server's life: past it the restored task is killed.
const lazyTimeout = 2 * time.Minute

// WithLazyPages makes restores lazy where the kernel lets the restored processes make a
// userfaultfd (LazyUsable); without it every restore is eager.
func WithLazyPages(on bool) Opt { return func(c *Checkpointer) { c.lazy = on } }

// unprivilegedUFFD is where the kernel says whether unprivileged processes may make one.
var unprivilegedUFFD = "/proc/sys/vm/unprivileged_userfaultfd"

// LazyUsable reports whether a restore into a container with spec can be lazy, and why not.
func LazyUsable(spec *specs.Spec) (bool, string) {
	if spec == nil || spec.Linux == nil {
		return false, "no Linux spec"
	}
	userns := false
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.UserNamespace {
			userns = true
		}
	}
	if !userns {
		return true, ""
	}
	b, err := os.ReadFile(unprivilegedUFFD)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return true, ""
	}
	return false, "the container has a user namespace and vm.unprivileged_userfaultfd is not 1"
}

// lazyServer is a running `criu lazy-pages`.
type lazyServer struct {
	cmd  *exec.Cmd
	work string
	done chan error
	// finished is closed once watch has seen the server end and cleaned up (tests).
	finished chan struct{}
}

// startLazy links the images into the work directory (the caller may delete its directory
// once Restore returns; the server reads pages long after) and starts the page server on them,
// returning once it listens. Any error means: restore eagerly.
func (c *Checkpointer) startLazy(ctx context.Context, images, work string) (*lazyServer, error) {
	dir := filepath.Join(work, "images")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(images)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".img") {
			continue
		}
		if err := os.Link(filepath.Join(images, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return nil, fmt.Errorf("link images for the page server: %w", err)
		}
	}
	cmd := exec.Command(c.criuPath, "lazy-pages", "-D", dir, "-W", work, "-o", LazyLog, "-v2")
	cmd.Dir = work
	// Its own process group, and no death signal: a daemon killed mid-restore leaves it to
	// finish serving the processes it restored.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &lazyServer{cmd: cmd, work: work, done: make(chan error, 1), finished: make(chan struct{})}
	go func() { l.done <- cmd.Wait() }()
	sock := filepath.Join(work, lazySocket)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return l, nil
		}
		select {
		case err := <-l.done:
			return nil, fmt.Errorf("criu lazy-pages exited before listening (%v): %s", err, lastBytes(readLog(work), 300))
		case <-ctx.Done():
			l.stop()
			return nil, ctx.Err()
		case <-time.After(500 * time.Microsecond):
		}
		if time.Now().After(deadline) {
			l.stop()
			return nil, fmt.Errorf("criu lazy-pages not listening after 5s: %w", errdefs.ErrUnavailable)
		}
	}
}

// stop kills a page server that has nothing (more) to serve and waits for it.
func (l *lazyServer) stop() {
	_ = l.cmd.Process.Kill()
	<-l.done
}

// watch waits for the page server in the background: when it ends, the work directory goes;
// if it failed or outlived lazyTimeout, kill is called first (the restored task's processes may
// miss memory). kill must reach the restored task only, never a later task of the same
// container (killInit); done runs last.
func (l *lazyServer) watch(ctx context.Context, id string, kill func() error, done func()) {
	ctx = context.WithoutCancel(ctx)
	go func() {
		var err error
		select {
		case err = <-l.done:
		case <-time.After(lazyTimeout):
			l.stop()
			err = fmt.Errorf("still serving after %s", lazyTimeout)
		}
		if err != nil {
			log.L(ctx).Error("criu lazy-pages failed: the restored task is killed (its memory may be incomplete)",
				"container", id, "error", err, "log", lastBytes(readLog(l.work), 500))
			if kerr := kill(); kerr != nil {
				log.L(ctx).Error("kill the lazily restored task", "container", id, "error", kerr)
			}
		}
		done()
		os.RemoveAll(l.work)
		close(l.finished)
	}()
}

// lastBytes returns the end of s, at most n bytes.
func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// killInit returns a kill for watch that signals the restored init through a pidfd opened
// now, while it is known to be that task's (a later rollback may start another task in the
// same container, which containerd's Kill would reach), and a release of the pidfd. Killing a
// pid namespace's init kills every process in it.
func killInit(pid uint32) (kill func() error, release func(), err error) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return nil, nil, fmt.Errorf("pidfd of the restored init %d: %w", pid, err)
	}
	kill = func() error { return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) }
	return kill, func() { unix.Close(fd) }, nil
}

// readLog returns the page server's log.
func readLog(work string) string {
	b, _ := os.ReadFile(filepath.Join(work, LazyLog))
	return string(b)
}

// lazyConfig adds lazyOption to the container's CRIU configuration file and returns a function
// that puts the file back as it was. A container without a DeltaBox-written file (no
// annotation, or runc's default) is not touched: errNoLazyConfig.
func lazyConfig(ctx context.Context, ctr containerd.Container) (func() error, error) {
	conf, err := ConfigOf(ctx, ctr)
	if err != nil {
		return nil, err
	}
	if conf == "" || conf == DefaultRuncConfig {
		return nil, errNoLazyConfig
	}
	orig, err := os.ReadFile(conf)
	if err != nil {
		return nil, err
	}
	orig = stripLazyLines(orig)
	if err := writeFileAtomic(conf, append(append([]byte(nil), orig...), lazyOption+"\n"...), 0o644); err != nil {
		return nil, err
	}
	return func() error { return writeFileAtomic(conf, orig, 0o644) }, nil
}

var errNoLazyConfig = errors.New("the container has no CRIU configuration file of DeltaBox's")

// stripLazy removes lazyOption from the container's CRIU configuration file if a restore left
// it there (a daemon killed between lazyConfig and its undo): a dump with it would wait for a
// page server.
func stripLazy(conf string) error {
	if conf == "" {
		return nil
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		return nil // no file: nothing to strip (CRIU ignores a missing file)
	}
	if s := stripLazyLines(b); !bytes.Equal(s, b) {
		return writeFileAtomic(conf, s, 0o644)
	}
	return nil
}

// stripLazyLines drops every line that sets lazyOption.
func stripLazyLines(b []byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) > 0 && strings.TrimLeft(f[0], "-") == lazyOption {
			continue
		}
		out = append(out, line...)
	}
	return out
}
