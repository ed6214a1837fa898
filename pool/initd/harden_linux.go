//go:build linux

package initd

import (
	"io"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// Harden protects the init from the sandbox it serves, before it does anything else:
//   - PR_SET_DUMPABLE 0: /proc/<init>/fd, /mem, /environ and ptrace(2) of the init then need
//     CAP_SYS_PTRACE, which a sandbox does not have (a same-uid process could otherwise attach,
//     read the next tenant's requests or write to the init's log through /proc/1/fd/1).
//   - every catchable signal but SIGCHLD gets a handler that drops it. A pid namespace's init
//     receives a signal from inside only if it has a handler for it; Go installs its own,
//     which exit on SIGTERM, SIGHUP, SIGINT and dump and exit on SIGQUIT, SIGABRT. Handlers,
//     unlike SIG_IGN, are reset to the default in the init's children, so execs keep normal
//     signals. keep names signals left to the caller (SIGTERM for a graceful stop outside
//     PID 1, where there is no pid namespace to protect).
//
// SIGKILL and SIGSTOP from inside the namespace are dropped by the kernel. Signals from the
// host (containerd's SIGKILL) still work.
func Harden(keep ...os.Signal) error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return err
	}
	drop := make(chan os.Signal, 16)
	signal.Notify(drop, droppedSignals(keep)...)
	go func() {
		for range drop {
		}
	}()
	return nil
}

// droppedSignals lists every catchable signal but SIGCHLD (the reaper's), the runtime's own
// SIGURG (preemption) and SIGPROF (profiling), and keep.
func droppedSignals(keep []os.Signal) []os.Signal {
	skip := map[unix.Signal]bool{unix.SIGKILL: true, unix.SIGSTOP: true, unix.SIGCHLD: true,
		unix.SIGURG: true, unix.SIGPROF: true, 32: true, 33: true} // 32, 33: libc's, unused by Go
	for _, s := range keep {
		if u, ok := s.(unix.Signal); ok {
			skip[u] = true
		}
	}
	var out []os.Signal
	for s := unix.Signal(1); s <= 64; s++ {
		if !skip[s] {
			out = append(out, s)
		}
	}
	return out
}

// LimitWriter passes at most n bytes to w, then one notice, then drops everything: the
// init's log ends up in a host file (the container's log), which a flood must not grow.
func LimitWriter(w io.Writer, n int64) io.Writer { return &limitWriter{w: w, left: n} }

type limitWriter struct {
	mu   sync.Mutex
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.left < 0:
	case int64(len(p)) <= l.left:
		l.left -= int64(len(p))
		_, _ = l.w.Write(p)
	default:
		l.left = -1
		_, _ = io.WriteString(l.w, "deltabox-init: log limit reached, further log lines are dropped\n")
	}
	return len(p), nil
}
