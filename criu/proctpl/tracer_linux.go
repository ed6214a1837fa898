package proctpl

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ErrMultiThreaded marks a process a template cannot copy: fork copies one thread.
var ErrMultiThreaded = errors.New("multi-threaded process: a fork copies only one thread")

// seizeOptions: the kernel kills every tracee when the tracer thread dies (EXITKILL), and
// the children of injected forks are auto-attached (TRACEFORK, TRACECLONE).
const seizeOptions = unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACESYSGOOD |
	unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACECLONE

// Tracer runs every ptrace request of the daemon on one locked OS thread, which therefore
// is the tracer of every template for as long as the daemon lives.
type Tracer struct {
	reqs chan func()
}

// NewTracer starts the tracer thread. It is never stopped: its exit would kill the
// templates (PTRACE_O_EXITKILL).
func NewTracer() *Tracer {
	t := &Tracer{reqs: make(chan func())}
	ready := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the daemon
		close(ready)
		for f := range t.reqs {
			f()
		}
	}()
	<-ready
	return t
}

// do runs f on the tracer thread and waits for it.
func (t *Tracer) do(f func() error) error {
	done := make(chan error, 1)
	t.reqs <- func() { done <- f() }
	return <-done
}

func ptraceSeize(pid int) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, seizeOptions, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// ptraceDetach detaches pid and delivers sig (0: none) as it resumes.
func ptraceDetach(pid, sig int) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(pid), 0, uintptr(sig), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// stop is what one waited-for ptrace stop was.
type stop struct {
	sig   unix.Signal // WSTOPSIG
	event int         // PTRACE_EVENT_* (0 for a signal-delivery or syscall stop)
}

func (s stop) syscall() bool { return s.event == 0 && s.sig == unix.SIGTRAP|0x80 }

// signal reports a signal-delivery stop: the signal was taken from the queue and is the
// tracer's to pass on.
func (s stop) signal() bool {
	return s.event == 0 && s.sig != unix.SIGTRAP|0x80
}

// StopTimeout bounds how long Wait waits for a seized process to stop (one in an
// uninterruptible sleep may not): the tracer thread serves every sandbox.
var StopTimeout = 2 * time.Second

var errNotStopped = errors.New("not stopped yet")

// waitStopUntil is waitStop that gives up at deadline (errNotStopped), polling without
// blocking the tracer thread for longer.
func waitStopUntil(pid int, deadline time.Time) (stop, error) {
	for sleep := 10 * time.Microsecond; ; sleep = min(2*sleep, time.Millisecond) {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WALL|unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return stop{}, fmt.Errorf("wait for process %d: %w", pid, err)
		case got == pid && !ws.Stopped():
			return stop{}, fmt.Errorf("process %d ended (%s): %w", pid, describe(ws), errdefs.ErrNotFound)
		case got == pid:
			return stop{sig: ws.StopSignal(), event: int(ws >> 16)}, nil
		}
		if time.Now().After(deadline) {
			return stop{}, errNotStopped
		}
		nap(sleep)
	}
}

// nap sleeps d on the calling thread (nanosleep(2)): the tracer thread is locked and serves
// nothing else meanwhile, and the Go runtime's timers round a sleep under a millisecond up
// to about a millisecond here (its poller waits in whole milliseconds), which a seized
// process that stops 50 µs after the thaw would otherwise cost every checkpoint.
func nap(d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}

// detachWhenStopped lets go of a seized process that did not stop in time, once it does
// (or exits): a tracee can only be detached while stopped.
func (t *Tracer) detachWhenStopped(pid int) {
	for {
		time.Sleep(100 * time.Millisecond)
		done := false
		_ = t.do(func() error {
			st, err := waitStopUntil(pid, time.Now())
			if errors.Is(err, errNotStopped) {
				return nil
			}
			done = true
			if err == nil {
				sig := 0
				if st.signal() {
					sig = int(st.sig)
				}
				_ = ptraceDetach(pid, sig)
			}
			return nil
		})
		if done {
			return
		}
	}
}

// waitStop waits for the next stop of tracee pid; an exit is an error.
func waitStop(pid int) (stop, error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return stop{}, fmt.Errorf("wait for process %d: %w", pid, err)
		}
		break
	}
	if !ws.Stopped() {
		return stop{}, fmt.Errorf("process %d ended (%s): %w", pid, describe(ws), errdefs.ErrNotFound)
	}
	return stop{sig: ws.StopSignal(), event: int(ws >> 16)}, nil
}

func describe(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}
