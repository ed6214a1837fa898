package proctpl

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

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
}

// Pid is the template's host pid.
func (tp *Template) Pid() int { return tp.task.pid }

// hide makes the template non-dumpable (remembering the original's flag): only
// CAP_SYS_PTRACE may then read or write its memory. Runs on the tracer thread.
func (tp *Template) hide() error {
	d, _, err := tp.task.inject(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("prctl(PR_GET_DUMPABLE) in %d: %w", tp.task.pid, unix.Errno(-d))
	}
	tp.dumpable = uint64(d)
	if r, _, err := tp.task.inject(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 0); err != nil || r < 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE) in %d: %v %w", tp.task.pid, unix.Errno(-r), err)
	}
	return nil
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
		c, err := tp.task.fork()
		if err != nil {
			return err
		}
		cp := task{pid: c, regs: tp.task.regs, sysAddr: tp.task.sysAddr, dropSignals: true}
		if err := tp.prepare(&cp); err != nil {
			_ = unix.Kill(c, unix.SIGKILL)
			_, _ = waitExit(c)
			return err
		}
		sig := 0
		if len(tp.task.pending) > 0 {
			sig = int(tp.task.pending[0])
		}
		if err := ptraceDetach(c, sig); err != nil {
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
	if r, _, err := cp.inject(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, tp.dumpable); err != nil || r < 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE) in %d: %v %w", cp.pid, unix.Errno(-r), err)
	}
	return cp.restore()
}

// Alive reports whether the template still exists (a sandbox can SIGKILL its own
// templates). A dead one is collected.
func (tp *Template) Alive() bool {
	alive := false
	_ = tp.t.do(func() error {
		if tp.gone {
			return nil
		}
		var ws unix.WaitStatus
		pid, err := unix.Wait4(tp.task.pid, &ws, unix.WNOHANG|unix.WALL, nil)
		if err != nil || pid == tp.task.pid && !ws.Stopped() {
			tp.gone = true
			unix.Close(tp.pidfd)
			return nil
		}
		alive = true
		return nil
	})
	return alive
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
