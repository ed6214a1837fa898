//go:build linux

// Package main is deltabox-init, PID 1 of every DeltaBox sandbox. It is a static binary
// (CGO_ENABLED=0) bind-mounted read-only at /.deltabox/init; it reaps zombies and serves the
// pool/initproto protocol on a unix socket in the per-sandbox run directory. As PID 1 it
// drops every signal the sandbox can send it but initproto.UnparkSignal, and cannot be
// ptraced (initd.Harden); the host stops it with SIGKILL. The host parks its listener
// (initproto.OpPark) around CRIU dumps and unparks it with UnparkSignal, which from the
// sandbox can only make a parked init listen again. Outside a pid namespace (tests)
// SIGTERM/SIGINT kill every other process of the sandbox and stop it. It must stay tiny and
// dependency-light (x/sys only): all logic lives in pool/initd.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/deltabox/deltabox/pool/initd"
	"github.com/deltabox/deltabox/pool/initproto"
)

// version is stamped at link time with -ldflags "-X main.version=...".
var version = "dev"

// maxLog bounds what the init writes to its log (a host file) over its lifetime.
const maxLog = 256 << 10

// The main goroutine, which serves (and, after a CRIU restore, executes the init again:
// pool/initd/reexec_linux.go), stays on the process's first thread. An execve from another
// thread makes the kernel hand the thread group's pid over to that thread, during which the
// host can find /proc/<init> gone or out of its cgroup, and fence the sandbox.
func init() { runtime.LockOSThread() }

func main() {
	socket := flag.String("socket", initproto.DefaultSocketPath, "unix socket to listen on")
	killTimeout := flag.Duration("kill-timeout", 5*time.Second, "how long to wait for processes to die on kill")
	parkTimeout := flag.Duration("park-timeout", 30*time.Second, "how long the listener stays parked without an unpark signal")
	resumeFd := flag.Int(initd.ResumeFlag, -1, "descriptor of the state an earlier image of the init handed over (set by the init itself after a CRIU restore)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(initd.LimitWriter(os.Stderr, maxLog), nil)).With("component", "deltabox-init")
	stopSignals := []os.Signal{syscall.SIGTERM, syscall.SIGINT}
	if os.Getpid() == 1 {
		stopSignals = nil // in a sandbox only the host stops the init, with SIGKILL
	}
	// the host unparks the listener (initproto.UnparkSignal) after a dump; from the sandbox
	// that signal only makes a parked init listen again
	if err := initd.Harden(append(stopSignals, initproto.UnparkSignal)...); err != nil {
		exit("harden init", err)
	}
	opts := []initd.Option{}
	if *resumeFd >= 0 {
		st, err := initd.ReadResume(*resumeFd)
		if err != nil {
			logger.Error("resume after a restore: starting without the handed-over state", "error", err)
		} else {
			opts = append(opts, initd.WithResume(st))
		}
	}
	if err := run(*socket, *killTimeout, *parkTimeout, stopSignals, logger, opts...); err != nil {
		exit("serve", err)
	}
}

// exit ends the init with status 1 and says why on stderr directly, past the log's bound
// (a log that reached it would drop the one line that explains an init's exit). The host
// reports the status; a SIGKILL, the only other way an init ends, leaves no line.
func exit(what string, err error) {
	fmt.Fprintf(os.Stderr, "deltabox-init: exiting: %s: %v\n", what, err)
	os.Exit(1)
}

func run(socket string, killTimeout, parkTimeout time.Duration, stopSignals []os.Signal, logger *slog.Logger, opts ...initd.Option) error {
	ctx, stop := context.Background(), func() {}
	if len(stopSignals) > 0 {
		ctx, stop = signal.NotifyContext(ctx, stopSignals...)
	}
	defer stop()
	unpark := make(chan os.Signal, 4)
	signal.Notify(unpark, initproto.UnparkSignal)
	srv := initd.New(append([]initd.Option{initd.WithVersion(version), initd.WithKillTimeout(killTimeout), initd.WithLogger(logger),
		initd.WithUnpark(unpark), initd.WithParkTimeout(parkTimeout)}, opts...)...)
	l, err := initd.Listen(socket)
	if err != nil {
		return err
	}
	logger.Info("listening", "socket", socket, "pid", os.Getpid(), "version", version)
	if err := srv.Serve(ctx, l); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
