package proctpl

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Template is a stopped copy-on-write fork of a process at a checkpoint.
type Template struct {
	t        *Tracer
	task     task
	pidfd    int
	Origin   int           // host pid of the process it copies
	dumpable uint64        // the original's PR_GET_DUMPABLE, given back to copies
	offsets  map[int]int64 // fd -> offset at the checkpoint
	gone     bool
	// spare is a copy forked ahead (Prefork) and kept stopped like the template, which the
	// next Copy starts instead of forking: the fork (its page tables: ~1-2 ms for 50 MB of
	// heap) leaves the rollback's critical path. sparePid mirrors spare.pid for SparePid,
	// which is called off the tracer thread.
	spare    *task
	spareFd  int
	sparePid atomic.Int64
	armed    *task // a spare Arm prepared, started by the next Copy (or killed by Disarm)
	parked   bool  // the spare was parked (Prefork's park): Arm may run it
	// watch is a pidfd of the template that Alive polls off the tracer thread (-1: none,
	// or closed once the template is gone); watchMu keeps it open while polled.
	watchMu sync.Mutex
	watch   int
}

// Pid is the template's host pid.
func (tp *Template) Pid() int { return tp.task.pid }

// SparePid is the host pid of the copy Prefork made ahead, 0 when there is none. Like the
// template, it is no process of the sandbox's run.
func (tp *Template) SparePid() int { return int(tp.sparePid.Load()) }

// Prefork forks the copy that the next Copy starts, unless one is ready. The spare is the
// template's own fork, stopped by the tracer and non-dumpable like the template (Copy gives
// it its dumpable flag back when it starts it): the sandbox can kill it (Copy then forks
// anew), never change it. park, when not nil, is called with the spare's pid (e.g. to move
// it out of the sandbox's freezer cgroup); only a spare it parked can be Armed.
func (tp *Template) Prefork(park func(pid int) error) error {
	return tp.t.do(func() error {
		if tp.gone || tp.spare != nil {
			return nil
		}
		c, err := tp.task.fork()
		if err != nil {
			return fmt.Errorf("spare copy of template %d: %w", tp.task.pid, err)
		}
		fd, err := unix.PidfdOpen(c, 0)
		if err != nil {
			_ = unix.Kill(c, unix.SIGKILL)
			_, _ = waitExit(c)
			return err
		}
		tp.spare = &task{pid: c, regs: tp.task.regs, sysAddr: tp.task.sysAddr, dropSignals: true, step: tp.task.step}
		tp.spareFd = fd
		tp.sparePid.Store(int64(c))
		tp.parked = park != nil && park(c) == nil
		return nil
	})
}

// Arm prepares the spare as the next copy without starting it: its file offsets, its
// dumpable flag and its registers are set, and it stays stopped until Copy detaches it
// (or Disarm kills it). The spare must be able to run (not in a frozen cgroup): a caller
// that parks spares out of the sandbox's freezer cgroup can arm them while the sandbox is
// frozen, where nothing of the sandbox can reach the copy before it starts. It returns the
// copy's pid; without a live spare it does nothing (0, nil).
func (tp *Template) Arm() (int, error) {
	pid := 0
	err := tp.t.do(func() error {
		if tp.gone || tp.armed != nil {
			if tp.armed != nil {
				pid = tp.armed.pid
			}
			return nil
		}
		if !tp.parked { // it may be frozen with the sandbox: it could not run the calls
			return nil
		}
		sp := tp.takeSpare()
		if sp == nil {
			return nil
		}
		if err := tp.prepare(sp); err != nil {
			_ = unix.Kill(sp.pid, unix.SIGKILL)
			_, _ = waitExit(sp.pid)
			return fmt.Errorf("arm the copy of template %d: %w", tp.task.pid, err)
		}
		tp.armed, pid = sp, sp.pid
		return nil
	})
	return pid, err
}

// Disarm kills an armed copy that will not be started.
func (tp *Template) Disarm() {
	_ = tp.t.do(func() error {
		if tp.armed != nil {
			tp.t.killTracee(tp.armed.pid)
			tp.armed = nil
		}
		return nil
	})
}

// killTracee SIGKILLs a tracee and has it collected once it exited (it may be in a frozen
// cgroup: it dies when thawed). Tracer thread.
func (t *Tracer) killTracee(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	go t.collect(pid, fd)
}

// DropSpare kills the copy Prefork made ahead, if any.
func (tp *Template) DropSpare() {
	_ = tp.t.do(func() error {
		tp.dropSpare()
		return nil
	})
}

// takeSpare hands the spare over to Copy, or nil when there is none or it was killed
// (then collected). Tracer thread.
func (tp *Template) takeSpare() *task {
	sp := tp.spare
	if sp == nil {
		return nil
	}
	tp.spare = nil
	tp.sparePid.Store(0)
	fd := tp.spareFd
	var ws unix.WaitStatus
	pid, err := unix.Wait4(sp.pid, &ws, unix.WNOHANG|unix.WALL, nil)
	if err != nil || pid == sp.pid && !ws.Stopped() { // killed from inside: gone
		unix.Close(fd)
		return nil
	}
	unix.Close(fd) // the copy's pid stays ours until it is detached (it is our tracee)
	return sp
}

// dropSpare kills the spare, if any. Tracer thread.
func (tp *Template) dropSpare() {
	if tp.spare == nil {
		return
	}
	pid, fd := tp.spare.pid, tp.spareFd
	tp.spare = nil
	tp.sparePid.Store(0)
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	go tp.t.collect(pid, fd)
}

// Copy forks a running copy of the template and returns its host pid: the copy runs from
// the template's registers with the template's memory (copy-on-write), its regular files'
// offsets put back to the checkpoint's and its dumpable flag to the original's. The
// template stays, stopped.
func (tp *Template) Copy() (int, error) {
	var pid int
	err := tp.t.do(func() error {
		if tp.gone {
			return fmt.Errorf("template %d was released: %w", tp.task.pid, errdefs.ErrNotFound)
		}
		if a := tp.armed; a != nil { // prepared by Arm: only its start is left
			tp.armed = nil
			if err := ptraceDetach(a.pid, tp.pendingSignal()); err != nil {
				return fmt.Errorf("start copy %d: %w", a.pid, err)
			}
			pid = a.pid
			return nil
		}
		var cp task
		if sp := tp.takeSpare(); sp != nil {
			cp = *sp
		} else {
			c, err := tp.task.fork()
			if err != nil {
				return err
			}
			cp = task{pid: c, regs: tp.task.regs, sysAddr: tp.task.sysAddr, dropSignals: true, step: tp.task.step}
		}
		c := cp.pid
		if err := tp.prepare(&cp); err != nil {
			_ = unix.Kill(c, unix.SIGKILL)
			_, _ = waitExit(c)
			return err
		}
		if err := ptraceDetach(c, tp.pendingSignal()); err != nil {
			return fmt.Errorf("start copy %d: %w", c, err)
		}
		pid = c
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("copy of template %d (process %d): %w", tp.task.pid, tp.Origin, err)
	}
	return pid, nil
}

// pendingSignal is the signal a copy is started with: the first the process received while
// seized for the checkpoint (0: none).
func (tp *Template) pendingSignal() int {
	if len(tp.task.pending) > 0 {
		return int(tp.task.pending[0])
	}
	return 0
}

// prepare sets a new copy up before it runs. Runs on the tracer thread.
func (tp *Template) prepare(cp *task) error {
	for fd, off := range tp.offsets {
		if pos, ok := fdPos(tp.task.pid, fd); ok && pos == off {
			continue // the shared file description is already there: no injection
		}
		// A failure (the fd was closed since?) leaves that offset as it is.
		_, _, err := cp.inject(unix.SYS_LSEEK, uint64(fd), uint64(off), unix.SEEK_SET)
		if err != nil {
			return err
		}
	}
	if tp.dumpable == suidDumpUser { // otherwise the copy keeps the flag it inherited (forkHidden)
		if r, _, err := cp.inject(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, tp.dumpable); err != nil || r < 0 {
			return fmt.Errorf("prctl(PR_SET_DUMPABLE) in %d: %v %w", cp.pid, unix.Errno(-r), err)
		}
	}
	return cp.restore()
}

// Alive reports whether the template still exists (a sandbox can SIGKILL its own
// templates). A dead one is collected. A live one is told by its pidfd, which turns
// readable when the process exits, without a request to the tracer thread: a rollback asks
// in its frozen window for each template it copies, and each hand-over to and from that
// locked thread cost ~0.05 ms there.
func (tp *Template) Alive() bool {
	if tp.running() {
		return true
	}
	alive := false
	_ = tp.t.do(func() error {
		if tp.gone {
			return nil
		}
		var ws unix.WaitStatus
		pid, err := unix.Wait4(tp.task.pid, &ws, unix.WNOHANG|unix.WALL, nil)
		if err != nil || pid == tp.task.pid && !ws.Stopped() {
			tp.gone = true
			tp.dropSpare()
			tp.closeWatch()
			unix.Close(tp.pidfd)
			return nil
		}
		alive = true
		return nil
	})
	return alive
}

// running reports whether the template's process has not exited, as its watch pidfd says
// (false when there is none: Alive then asks the tracer thread).
func (tp *Template) running() bool {
	tp.watchMu.Lock()
	defer tp.watchMu.Unlock()
	if tp.watch < 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(tp.watch), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 0
}

// closeWatch closes the watch pidfd (the template is gone).
func (tp *Template) closeWatch() {
	tp.watchMu.Lock()
	defer tp.watchMu.Unlock()
	if tp.watch >= 0 {
		unix.Close(tp.watch)
		tp.watch = -1
	}
}

// Release kills the template without waiting for it: a template in a frozen cgroup dies
// only once thawed. A goroutine collects it when it is gone (its pidfd turns readable).
func (tp *Template) Release() {
	_ = tp.t.do(func() error {
		tp.kill()
		return nil
	})
}

// kill SIGKILLs the template through its pidfd and has it collected when it exits. Tracer
// thread.
func (tp *Template) kill() {
	if tp.gone {
		return
	}
	tp.gone = true
	tp.dropSpare()
	tp.closeWatch()
	if tp.armed != nil {
		tp.t.killTracee(tp.armed.pid)
		tp.armed = nil
	}
	if tp.pidfd < 0 {
		_ = unix.Kill(tp.task.pid, unix.SIGKILL)
		_, _ = waitExit(tp.task.pid)
		return
	}
	_ = unix.PidfdSendSignal(tp.pidfd, unix.SIGKILL, nil, 0)
	go tp.t.collect(tp.task.pid, tp.pidfd)
}

// collect waits (off the tracer thread) until a killed tracee exited, then reaps its
// ptrace exit on the tracer thread, so that its parent can reap it in turn.
func (t *Tracer) collect(pid, pidfd int) {
	defer unix.Close(pidfd)
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
			break
		}
	}
	_ = t.do(func() error {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WNOHANG|unix.WALL, nil)
		return err
	})
}

// waitExit collects a killed tracee.
func waitExit(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || !ws.Stopped() {
			return ws, err
		}
	}
}

// Bytes is the memory the template holds alone: its private pages (those the original or a
// copy changed since), from /proc/PID/smaps_rollup.
func (tp *Template) Bytes() int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", tp.task.pid))
	if err != nil {
		return 0
	}
	var kb int64
	for _, line := range strings.Split(string(data), "\n") {
		for _, k := range []string{"Private_Clean:", "Private_Dirty:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				kb += n
			}
		}
	}
	return kb << 10
}
