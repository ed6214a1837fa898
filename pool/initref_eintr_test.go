package pool

import (
	"errors"
	"os/exec"
	goruntime "runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestPidfdExitedIgnoresInterruptedPolls: a signal pending while the daemon polls a live
// init's pidfd (Go's preemption signal, SIGCHLD of a CNI plugin or mkfs) makes poll fail
// with EINTR; that is no exit. Before pidfdExited asked again, it counted EINTR as an exit,
// and a live sandbox was reported as "sandbox init (pid N) has exited" (the unexplained init
// exit of the issue 12 soak). The test floods the polling thread with SIGURG until raw polls
// next to pidfdExited's have seen EINTR many times, and pidfdExited must never say exited.
func TestPidfdExitedIgnoresInterruptedPolls(t *testing.T) {
	child := exec.Command("sleep", "100")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	fd, err := unix.PidfdOpen(child.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		testutil.SkipOrFail(t, "no pidfd on this kernel: %v", err) // pidfd_open is Linux 5.3+; the daemon needs it anyway
	}
	defer unix.Close(fd)

	var tid atomic.Int32
	stop := make(chan struct{})
	defer close(stop)
	type result struct{ falseExits, interrupted, polls int }
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		tid.Store(int32(unix.Gettid()))
		var r result
		deadline := time.Now().Add(60 * time.Second)
		for r.interrupted < 20 && time.Now().Before(deadline) {
			r.polls++
			if pidfdExited(uintptr(fd)) {
				r.falseExits++
			}
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(p, 0); errors.Is(err, unix.EINTR) {
				r.interrupted++
			}
		}
		done <- r
	}()
	for tid.Load() == 0 {
		goruntime.Gosched()
	}
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = unix.Tgkill(unix.Getpid(), int(tid.Load()), unix.SIGURG)
			}
		}
	}()
	r := <-done
	t.Logf("%d polls, %d interrupted raw polls", r.polls, r.interrupted)
	if r.falseExits > 0 {
		t.Fatalf("pidfdExited said a live process exited %d times in %d polls under signals", r.falseExits, r.polls)
	}
	if r.interrupted == 0 {
		t.Fatalf("no poll was interrupted in %d polls: the test did not exercise EINTR", r.polls)
	}
}
