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
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/deltabox/deltabox/pool/initd"
	"github.com/deltabox/deltabox/pool/initproto"
)

// version is stamped at link time with -ldflags "-X main.version=...".
var version = "dev"

// maxLog bounds what the init writes to its log (a host file) over its lifetime.
const maxLog = 256 << 10

func main() {
	socket := flag.String("socket", initproto.DefaultSocketPath, "unix socket to listen on")
	killTimeout := flag.Duration("kill-timeout", 5*time.Second, "how long to wait for processes to die on kill")
	parkTimeout := flag.Duration("park-timeout", 30*time.Second, "how long the listener stays parked without an unpark signal")
	hold := flag.Bool("hold", false, "only wait for stdin to close, then exit (the host runs it to make a sandbox's user and network namespaces)")
	flag.Parse()
	if *hold {
		_, _ = io.Copy(io.Discard, os.Stdin)
		return
	}
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
	if err := run(*socket, *killTimeout, *parkTimeout, stopSignals, logger); err != nil {
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

func run(socket string, killTimeout, parkTimeout time.Duration, stopSignals []os.Signal, logger *slog.Logger) error {
	ctx, stop := context.Background(), func() {}
	if len(stopSignals) > 0 {
		ctx, stop = signal.NotifyContext(ctx, stopSignals...)
	}
	defer stop()
	unpark := make(chan os.Signal, 4)
	signal.Notify(unpark, initproto.UnparkSignal)
	srv := initd.New(initd.WithVersion(version), initd.WithKillTimeout(killTimeout), initd.WithLogger(logger),
		initd.WithUnpark(unpark), initd.WithParkTimeout(parkTimeout))
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
