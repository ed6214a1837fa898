package pool

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// initRef holds a sandbox's init as a process, not a number: a pidfd opened right after the
// task started, and the init's root directory (/proc/<pid>/root) opened while the pidfd
// proved that the pid still named the init. A pid can be reused once the init exits; the
// fds cannot, so cp, verify and rollback act on the sandbox's root through rootDir, and the
// init socket's peer is accepted only while the pidfd says the init is alive.
type initRef struct {
	pid    uint32   // on the host
	pidfd  *os.File // PIDFD_NONBLOCK, readable once the process exited
	root   *os.File // O_PATH directory
	exited chan struct{}

	mu      sync.Mutex
	retired bool          // replaced or destroyed: its exit is expected
	done    chan struct{} // closed when retired
	failed  atomic.Pointer[string]
}

// openInitRef takes hold of pid, which must be a member of the sandbox's cgroup (so a
// reused pid never passes for the init), and opens its root.
func openInitRef(pid uint32, frz Freezer) (*initRef, error) {
	if pid == 0 {
		return nil, fmt.Errorf("sandbox task reported no pid: %w", errdefs.ErrFailedPrecondition)
	}
	fd, err := unix.PidfdOpen(int(pid), unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd of sandbox init %d: %w", pid, err)
	}
	r := &initRef{pid: pid, pidfd: os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(int(pid))),
		exited: make(chan struct{}), done: make(chan struct{})}
	if err := r.bind(frz); err != nil {
		r.pidfd.Close()
		return nil, err
	}
	return r, nil
}

// bind checks the pid's cgroup and opens its root while the pidfd shows it alive.
func (r *initRef) bind(frz Freezer) error {
	member, err := frz.member(int(r.pid))
	if err != nil || !member {
		return fmt.Errorf("pid %d is not in the sandbox's cgroup %s (%v): %w", r.pid, frz.dir, err, errdefs.ErrFailedPrecondition)
	}
	root, err := os.OpenFile(fmt.Sprintf("/proc/%d/root", r.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("root of sandbox init %d: %w", r.pid, err)
	}
	if err := r.alive(); err != nil { // the pid may have been reused since the cgroup check
		root.Close()
		return err
	}
	r.root = root
	return nil
}

// alive fails once the init exited: its pidfd is readable from the moment it exits (a zombie
// still takes signals, so a signal 0 would not tell).
func (r *initRef) alive() error {
	exited := true
	raw, err := r.pidfd.SyscallConn()
	if err == nil {
		err = raw.Control(func(fd uintptr) { exited = pidfdExited(fd) })
	}
	if err != nil || exited {
		return fmt.Errorf("sandbox init (pid %d) has exited: %w", r.pid, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// pidfdExited polls a pidfd without blocking: readable means the process exited. An
// interrupted poll is asked again (Go's preemption signal interrupts it, and taking EINTR for
// an exit fenced live sandboxes under load); any other failure of poll on a pidfd we hold
// open counts as an exit, the safe side.
func pidfdExited(fd uintptr) bool {
	for {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || (n > 0 && p[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0)
	}
}

// watch closes r.exited when the init exits (the pidfd becomes readable); it returns when
// the init exits or r is retired.
func (r *initRef) watch() {
	raw, err := r.pidfd.SyscallConn()
	if err != nil {
		return
	}
	err = raw.Read(pidfdExited)
	if err == nil {
		close(r.exited)
	}
}

// fail marks the sandbox failed for why (the first reason wins).
func (r *initRef) fail(why string) { r.failed.CompareAndSwap(nil, &why) }

// failure says why the sandbox failed ("" while it is usable, or while its init is being
// replaced on purpose): the reason it was fenced for, or its init's exit.
func (r *initRef) failure() string {
	if why := r.failed.Load(); why != nil {
		return *why
	}
	r.mu.Lock()
	retired := r.retired
	r.mu.Unlock()
	if retired {
		return ""
	}
	if r.alive() != nil {
		return fmt.Sprintf("its init (pid %d) exited", r.pid)
	}
	return ""
}

// usable returns a failed_precondition error once the sandbox failed or its init exited.
func (r *initRef) usable() error {
	if r == nil {
		return fmt.Errorf("sandbox init is not attached: %w", errdefs.ErrFailedPrecondition)
	}
	if why := r.failed.Load(); why != nil {
		return fmt.Errorf("sandbox failed (%s); release it: %w", *why, errdefs.ErrFailedPrecondition)
	}
	select {
	case <-r.exited:
		return fmt.Errorf("sandbox failed: its init (pid %d) exited; release it: %w", r.pid, errdefs.ErrFailedPrecondition)
	default:
	}
	r.mu.Lock()
	retired := r.retired
	r.mu.Unlock()
	if retired {
		return fmt.Errorf("sandbox init (pid %d) was replaced or destroyed: %w", r.pid, errdefs.ErrFailedPrecondition)
	}
	if err := r.alive(); err != nil { // exited, and the watcher has not fenced it yet
		return fmt.Errorf("sandbox failed: its init (pid %d) exited; release it: %w", r.pid, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// openRoot duplicates the root fd for one operation; the caller closes it.
func (r *initRef) openRoot() (*os.File, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retired {
		return nil, fmt.Errorf("sandbox init (pid %d) was replaced or destroyed: %w", r.pid, errdefs.ErrFailedPrecondition)
	}
	fd, err := unix.FcntlInt(r.root.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate sandbox root fd: %w", err)
	}
	return os.NewFile(uintptr(fd), r.root.Name()), nil
}

// signal sends sig to the init through its pidfd.
func (r *initRef) signal(sig unix.Signal) error {
	if err := r.usable(); err != nil {
		return err
	}
	var serr error
	raw, err := r.pidfd.SyscallConn()
	if err == nil {
		err = raw.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
	if err = errors.Join(err, serr); err != nil {
		return fmt.Errorf("signal sandbox init (pid %d): %w", r.pid, err)
	}
	return nil
}

// checkPeer accepts the init socket's server only if it is this init, still alive.
func (r *initRef) checkPeer(pid int32, _, _ uint32) error {
	if uint32(pid) != r.pid {
		return fmt.Errorf("served by pid %d, not by the sandbox init (pid %d): another process replaced the socket, refusing: %w",
			pid, r.pid, errdefs.ErrPermissionDenied)
	}
	return r.alive()
}

// retire marks r's exit as expected (a task replaced or destroyed) and closes its fds.
func (r *initRef) retire() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retired {
		return
	}
	r.retired = true
	close(r.done)
	r.pidfd.Close()
	if r.root != nil {
		r.root.Close()
	}
}

// errNoInit is what the peer check says before an init is attached.
var errNoInit = errors.New("no sandbox init attached yet")

// attach takes hold of the instance's current pid as its init (see initRef).
func (inst *instance) attach() error {
	ref, err := openInitRef(inst.pid, NewFreezer(inst.layout.Cgroup))
	if err != nil {
		return err
	}
	if old := inst.ref.Swap(ref); old != nil {
		old.retire()
	}
	go ref.watch()
	return nil
}

// checkPeer is the init client's peer check: the socket's server must be the attached init.
func (inst *instance) checkPeer(pid int32, uid, gid uint32) error {
	ref := inst.ref.Load()
	if ref == nil {
		return fmt.Errorf("%w: %w", errNoInit, errdefs.ErrUnavailable)
	}
	return ref.checkPeer(pid, uid, gid)
}
