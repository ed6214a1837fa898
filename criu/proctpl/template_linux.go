package proctpl

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Proc is a process seized for a checkpoint: stopped by the tracer until Resume.
type Proc struct {
	t       *Tracer
	task    task
	pidfd   int
	offsets map[int]int64 // fd -> offset of the regular files it has open
	stopped bool
	// inspected: offsets and task.sysAddr were read by Inspect while the process was frozen
	inspected bool
}

// Pid is the process's host pid.
func (p *Proc) Pid() int { return p.task.pid }

// Seize attaches to pid and asks it to stop (PTRACE_INTERRUPT) without waiting: it works
// on a process frozen by the cgroup freezer, which stops for the tracer as soon as it is
// thawed, before it runs another instruction of its own. check is called between taking a
// pidfd and seizing (e.g. "is pid a member of the sandbox's cgroup"); a pid reused after
// the check is detected through the pidfd and released. A multi-threaded process is refused
// with ErrMultiThreaded before anything is done to it.
func (t *Tracer) Seize(pid int, check func(pid int) error) (*Proc, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("process %d: %w (%w)", pid, err, errdefs.ErrNotFound)
	}
	p := &Proc{t: t, task: task{pid: pid}, pidfd: fd}
	if err := p.seize(check); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return p, nil
}

func (p *Proc) seize(check func(pid int) error) error {
	pid := p.task.pid
	if err := check(pid); err != nil {
		return err
	}
	if n, err := threads(pid); err != nil {
		return fmt.Errorf("process %d: %w", pid, err)
	} else if n != 1 {
		return fmt.Errorf("process %d has %d threads: %w", pid, n, ErrMultiThreaded)
	}
	return p.t.do(func() error {
		if err := ptraceSeize(pid); err != nil {
			return fmt.Errorf("seize process %d: %w", pid, err)
		}
		if unix.PidfdSendSignal(p.pidfd, 0, nil, 0) != nil { // gone: pid may be another's now
			_ = ptraceDetach(pid, 0)
			return fmt.Errorf("process %d exited: %w", pid, errdefs.ErrNotFound)
		}
		if err := unix.PtraceInterrupt(pid); err != nil {
			_ = ptraceDetach(pid, 0)
			return fmt.Errorf("interrupt process %d: %w", pid, err)
		}
		return nil
	})
}

// Inspect reads, ahead of Wait, what Wait and the template's injected calls need of the
// process besides its registers: the offsets of the regular files it has open, the address
// of a syscall instruction in its vDSO and how calls are injected (its SIGTRAP's mask and
// disposition, stepMode). Call it while the seized process cannot run (its cgroup frozen):
// from the freeze to its stop for the tracer after the thaw it runs no instruction of its
// own, so none of them can change, and the reads (/proc files and a directory) leave the
// time between the thaw and the template. A failure is not an error: Wait reads them itself.
func (p *Proc) Inspect() {
	addr, err := syscallInVDSO(p.task.pid)
	if err != nil {
		return
	}
	p.task.sysAddr, p.offsets, p.inspected = addr, fileOffsets(p.task.pid), true
	p.task.step = stepOf(p.task.pid)
}

// Wait waits until the seized process stopped for the tracer and saves its registers and,
// unless Inspect read them, the address of a syscall instruction and its files' offsets.
func (p *Proc) Wait() error {
	if p.stopped {
		return nil
	}
	return p.t.do(p.wait)
}

// wait is Wait on the tracer thread.
func (p *Proc) wait() error {
	if p.stopped {
		return nil
	}
	pid := p.task.pid
	err := func() error {
		deadline := time.Now().Add(StopTimeout)
		for {
			st, err := waitStopUntil(pid, deadline)
			if errors.Is(err, errNotStopped) {
				go p.t.detachWhenStopped(pid)
				return fmt.Errorf("process %d did not stop within %s (uninterruptible?): %w", pid, StopTimeout, errdefs.ErrUnavailable)
			}
			if err != nil {
				return err
			}
			if st.event == unix.PTRACE_EVENT_STOP {
				break
			}
			if st.signal() {
				p.task.pending = append(p.task.pending, st.sig)
			}
			if err := unix.PtraceInterrupt(pid); err != nil {
				return err
			}
			if err := unix.PtraceCont(pid, 0); err != nil {
				return err
			}
		}
		var r unix.PtraceRegs
		if err := unix.PtraceGetRegs(pid, &r); err != nil {
			return fmt.Errorf("registers of %d: %w", pid, err)
		}
		if r.Cs != userCS64 {
			return fmt.Errorf("process %d is not a 64-bit process: %w", pid, errdefs.ErrNotImplemented)
		}
		p.task.regs = normalize(r)
		p.stopped = true
		if p.inspected {
			return nil
		}
		var err error
		p.task.sysAddr, err = syscallInVDSO(pid)
		return err
	}()
	if err != nil || p.inspected {
		return err
	}
	p.offsets = fileOffsets(pid)
	return nil
}

// Resume restores the process's registers and lets it run (detached), passing on a signal
// it received while stopped.
func (p *Proc) Resume() error {
	return p.t.do(p.resume)
}

// resume is Resume on the tracer thread.
func (p *Proc) resume() error {
	defer unix.Close(p.pidfd)
	if p.stopped {
		if err := p.task.restore(); err != nil {
			_ = ptraceDetach(p.task.pid, 0)
			return err
		}
	}
	sig := 0
	if len(p.task.pending) > 0 {
		sig = int(p.task.pending[0])
	}
	if err := ptraceDetach(p.task.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("resume process %d: %w", p.task.pid, err)
	}
	return nil
}

// Template forks the stopped process into a template (see the package comment).
func (p *Proc) Template() (*Template, error) {
	var tp *Template
	err := p.t.do(func() (err error) {
		tp, err = p.template()
		return err
	})
	return tp, err
}

// template is Template on the tracer thread.
func (p *Proc) template() (*Template, error) {
	if !p.stopped {
		return nil, fmt.Errorf("process %d is not stopped: %w", p.task.pid, errdefs.ErrFailedPrecondition)
	}
	tp := &Template{t: p.t, Origin: p.task.pid, offsets: p.offsets, pidfd: -1, watch: -1}
	err := func() error {
		c, dumpable, err := p.task.forkHidden()
		if err != nil {
			return err
		}
		tp.dumpable = dumpable
		tp.task = task{pid: c, regs: p.task.regs, sysAddr: p.task.sysAddr, dropSignals: true, step: p.task.step,
			pending: slices.Clone(p.task.pending)}
		if tp.pidfd, err = unix.PidfdOpen(c, 0); err != nil {
			_ = unix.Kill(c, unix.SIGKILL)
			_, _ = waitExit(c)
			return err
		}
		if w, err := unix.FcntlInt(uintptr(tp.pidfd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			tp.watch = w // else Alive asks the tracer thread each time
		}
		if err := tp.task.restore(); err != nil {
			tp.kill()
			return err
		}
		return nil
	}()
	if err != nil {
		return nil, fmt.Errorf("template of process %d: %w", p.task.pid, err)
	}
	return tp, nil
}

// Kept is what Keep did with a seized process and when.
type Kept struct {
	Template *Template // nil when err is not
	// Stopped, Templated and Resumed are when the process was found stopped, when its
	// template was made (or failed) and when it ran again.
	Stopped, Templated, Resumed time.Time
	// ResumeErr is why the process could not be resumed (the template, if made, stands).
	ResumeErr error
}

// Keep is Wait, Template and Resume in one request to the tracer thread: each request is a
// hand-over to and from that locked thread (tens of microseconds each on a loaded VM),
// paid while the process is stopped. before (nil: none) runs on the tracer thread once the
// process stopped, and its error fails the template (a failpoint). The process is resumed
// whatever fails; the error is the template's (a failed resume is k.ResumeErr).
func (p *Proc) Keep(before func() error) (Kept, error) {
	var k Kept
	var err error
	_ = p.t.do(func() error {
		err = p.wait()
		k.Stopped = time.Now()
		if err == nil && before != nil {
			err = before()
		}
		if err == nil {
			k.Template, err = p.template()
		}
		k.Templated = time.Now()
		k.ResumeErr = p.resume()
		k.Resumed = time.Now()
		return nil
	})
	return k, err
}

// suidDumpUser is PR_GET_DUMPABLE's "dumpable" (SUID_DUMP_USER): a process of the same
// user may then ptrace it and open its /proc/PID/mem.
const suidDumpUser = 1

// forkHidden forks the stopped task t into a child that is non-dumpable from its first
// instant, and returns t's dumpable flag. The sandbox runs while a template is made (only
// the seized processes are stopped), so a template born dumpable and hidden afterwards
// could have its /proc/PID/mem opened by a process of the sandbox in between, and that
// file would stay open, and writable, for good. So t itself is made non-dumpable for the
// clone, whose child inherits the flag, and gets its own back at once. A flag other than
// "dumpable" (0, or 2 from a credential change) is inherited as it is: it shuts out the
// sandbox already. Runs on the tracer thread.
func (t *task) forkHidden() (child int, dumpable uint64, err error) {
	d, _, err := t.inject(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE)
	if err != nil {
		return 0, 0, err
	}
	if d < 0 {
		return 0, 0, fmt.Errorf("prctl(PR_GET_DUMPABLE) in %d: %w", t.pid, unix.Errno(-d))
	}
	if d == suidDumpUser {
		if r, _, err := t.inject(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 0); err != nil || r < 0 {
			return 0, 0, fmt.Errorf("prctl(PR_SET_DUMPABLE, 0) in %d: %v %w", t.pid, unix.Errno(-r), err)
		}
	}
	child, err = t.fork()
	if err == nil && testHookForked != nil {
		testHookForked(child)
	}
	if d == suidDumpUser { // whatever the fork did: the original runs on as it was
		if r, _, rerr := t.inject(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, suidDumpUser); rerr != nil || r < 0 {
			if err == nil {
				_ = unix.Kill(child, unix.SIGKILL)
				_, _ = waitExit(child)
			}
			return 0, 0, fmt.Errorf("give process %d its dumpable flag back: %v %w", t.pid, unix.Errno(-r), rerr)
		}
	}
	return child, uint64(d), err
}

// testHookForked, when set (tests), is called on the tracer thread with a template's pid
// as soon as its clone returned, before anything else is done to it.
var testHookForked func(child int)

// fork injects clone(CLONE_PARENT|SIGCHLD) into t and waits for the child's first stop.
// Runs on the tracer thread.
func (t *task) fork() (int, error) {
	ret, child, err := t.inject(unix.SYS_CLONE, uint64(cloneParent))
	if err != nil {
		if child > 0 {
			_ = unix.Kill(child, unix.SIGKILL)
		}
		return 0, err
	}
	if ret < 0 || child <= 0 {
		return 0, fmt.Errorf("fork of process %d: %w", t.pid, unix.Errno(-ret))
	}
	if _, err := waitStop(child); err != nil {
		return 0, err
	}
	return child, nil
}

// fileOffsets reads the offsets of the regular files pid has open.
func fileOffsets(pid int) map[int]int64 {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[int]int64{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(dir+"/"+e.Name(), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if pos, ok := fdPos(pid, fd); ok {
			out[fd] = pos
		}
	}
	return out
}

// fdPos reads the offset of pid's fd from /proc/PID/fdinfo.
func fdPos(pid, fd int) (int64, bool) {
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "pos:"); ok {
			pos, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return pos, err == nil
		}
	}
	return 0, false
}
