//go:build linux

// Package main is deltabox-init, PID 1 of every DeltaBox sandbox. It is a static binary
// (CGO_ENABLED=0) bind-mounted read-only at /.deltabox/init; it reaps zombies, serves the
// pool/initproto protocol on a unix socket in the per-sandbox run directory, and on
// SIGTERM/SIGINT kills every other process of the sandbox and exits. It must stay tiny and
// dependency-light (x/sys only): all logic lives in pool/initd.
package main

import (
	"context"
	"flag"
	"fmt"
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

func main() {
	socket := flag.String("socket", initproto.DefaultSocketPath, "unix socket to listen on")
	killTimeout := flag.Duration("kill-timeout", 5*time.Second, "how long to wait for processes to die on kill")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "deltabox-init")
	if err := run(*socket, *killTimeout, logger); err != nil {
		logger.Error("init failed", "error", err)
		os.Exit(1)
	}
}

func run(socket string, killTimeout time.Duration, logger *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := initd.New(initd.WithVersion(version), initd.WithKillTimeout(killTimeout), initd.WithLogger(logger))
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
