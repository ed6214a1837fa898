//go:build !cli

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/config"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/version"
	"github.com/deltabox/deltabox/orchestrator"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/network"
)

// shutdownTimeout bounds how long in-flight requests may run after SIGTERM.
const shutdownTimeout = 30 * time.Second

func daemonCommand() *cli.Command {
	def := config.Default() // the flags' help quotes the defaults; default.toml holds them
	return &cli.Command{
		Name:  "daemon",
		Usage: daemonUsage,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "TOML config `FILE` (see: deltabox config default)"},
			&cli.StringFlag{Name: "root", Usage: "state root (default from config: " + def.Root + ")"},
			&cli.StringFlag{Name: "address", Usage: "API socket to listen on (default from config: " + def.Address + ")"},
			&cli.StringFlag{Name: "containerd-address", Usage: "containerd socket (default from config: " + def.Containerd.Address + ")"},
			&cli.StringFlag{Name: "namespace", Usage: "containerd namespace (default from config: " + def.Containerd.Namespace + ")"},
			&cli.StringFlag{Name: "log-level", Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "init-binary", Usage: "static deltabox-init (default: next to this binary)"},
		},
		Action: runDaemon,
	}
}

// daemonConfig merges the config file (or the defaults) with the command-line flags.
func daemonConfig(c *cli.Context) (config.Config, error) {
	cfg := config.Default()
	if path := c.String("config"); path != "" {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return cfg, err
		}
	}
	override := func(flag string, dst *string) {
		if c.IsSet(flag) {
			*dst = c.String(flag)
		}
	}
	override("root", &cfg.Root)
	override("containerd-address", &cfg.Containerd.Address)
	override("namespace", &cfg.Containerd.Namespace)
	override("log-level", &cfg.Log.Level)
	if c.IsSet("address") {
		cfg.Address = c.String("address")
	} else if g := c.Lineage()[1]; g.IsSet("address") && !strings.HasPrefix(g.String("address"), "tcp://") {
		// The global --address names the same socket (a tcp:// one is a client's: [api] tcp_address).
		cfg.Address = g.String("address")
	}
	return cfg, nil
}

func runDaemon(c *cli.Context) error {
	if err := exactArgs(c, 0, ""); err != nil {
		return err
	}
	if euid := os.Geteuid(); euid != 0 {
		return fmt.Errorf("deltabox daemon needs root (running as uid %d): it drives containerd, cgroups, mounts and CRIU", euid)
	}
	cfg, err := daemonConfig(c)
	if err != nil {
		return err
	}
	slog.SetDefault(newLogger(cfg.Log, c.App.ErrWriter))
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return serve(ctx, cfg, initBinaryPath(c.String("init-binary")))
}

func serve(ctx context.Context, cfg config.Config, initBinary string) error {
	netOpts, err := networkOptions(cfg.Network)
	if err != nil {
		return err
	}
	defaults, err := sandboxDefaults(cfg.Sandbox)
	if err != nil {
		return err
	}
	tplNode, tplSandbox, err := cfg.Checkpoints.TemplateMemoryBytes()
	if err != nil {
		return err
	}
	forkLayerMem, err := cfg.Checkpoints.ForkLayerMemoryBytes()
	if err != nil {
		return err
	}
	restoreMem, err := cfg.Snapshots.RestoreMemoryBytes()
	if err != nil {
		return err
	}
	hugeBudget, err := cfg.Checkpoints.HugePagesBudgetDuration()
	if err != nil {
		return err
	}
	if cfg.Checkpoints.FavorDynMods {
		if changed, err := pool.FavorDynMods(); err != nil {
			log.L(ctx).Warn("cgroup2 favordynmods: not set (cgroup moves may wait for RCU grace periods)", "error", err)
		} else if len(changed) > 0 {
			log.L(ctx).Info("cgroup2 reconfigured with favordynmods", "mounts", changed)
		}
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o, err := orchestrator.New(ctx, orchestrator.Options{
		Root: cfg.Root, ContainerdAddress: cfg.Containerd.Address, Namespace: cfg.Containerd.Namespace,
		CRIUPath: cfg.CRIU.Path, ObjectStoreURI: cfg.ObjectStore.URI, InitBinary: initBinary,
		Metrics: registry, Retain: cfg.Checkpoints.Retain, RetainBranch: cfg.Checkpoints.RetainBranch,
		StepMax: cfg.Checkpoints.StepRecords, StepOutputBytes: cfg.Checkpoints.StepOutputBytes, L2Every: cfg.Checkpoints.L2Every,
		WalkUpperDirs: !cfg.Checkpoints.TrackChanges, TemplateMemory: tplNode, TemplateMemorySandbox: tplSandbox, TemplateCheckpoints: cfg.Checkpoints.TemplateCheckpoints, HugePagesBudget: hugeBudget, Network: netOpts, SandboxDefaults: defaults,
		Egress: egressOptions(cfg.Egress), ForkLayerMemory: forkLayerMem,
		Snapshots: orchestrator.SnapshotOptions{SigningKey: cfg.Snapshots.SigningKey, TrustedKeys: cfg.Snapshots.TrustedKeys,
			RestoreTimeout: cfg.Snapshots.RestoreTimeout.Duration, DumpTimeout: cfg.Snapshots.DumpTimeout.Duration,
			LazyRestore: cfg.Snapshots.LazyRestore, RestoreMemory: restoreMem},
	})
	if err != nil {
		return err
	}
	defer o.Close(context.WithoutCancel(ctx))
	gid, err := lookupGroup(cfg.SocketGroup)
	if err != nil {
		return err
	}
	l, err := orchestrator.Listen(cfg.Address, gid)
	if err != nil {
		return err
	}
	if err := serveMetrics(ctx, cfg.Metrics.Address, registry); err != nil {
		return err
	}
	if err := serveE2B(ctx, cfg.E2B, o); err != nil {
		return err
	}
	handler := o.Handler() // one handler (and request limiter) for the socket and the TCP listener
	if err := serveRemote(ctx, cfg.API, cfg.Root, o, handler); err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.L(ctx).Info("daemon started", "version", version.Version, "address", cfg.Address,
		"root", cfg.Root, "containerd", cfg.Containerd.Address, "namespace", cfg.Containerd.Namespace)
	tctx, stopTemporal := context.WithCancel(ctx)
	defer stopTemporal()
	waitTemporal, err := startTemporal(tctx, cfg)
	if err != nil {
		return err
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve API on %s: %w", cfg.Address, err)
	case <-ctx.Done():
	}
	log.L(ctx).Info("daemon stopping", "reason", context.Cause(ctx))
	waitTemporal() // its activities use the API: stop taking work before the API goes
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down API server: %w", err)
	}
	_ = os.Remove(cfg.Address)
	log.L(ctx).Info("daemon stopped")
	return nil
}

// networkOptions turns the [network] section into pool/network options (nil: disabled).
func networkOptions(c config.Network) (*network.Options, error) {
	if !c.Enabled {
		return nil, nil
	}
	subnet, err := netip.ParsePrefix(c.Subnet)
	if err != nil {
		return nil, fmt.Errorf("network.subnet %q: %v: %w", c.Subnet, err, errdefs.ErrInvalidArgument)
	}
	return &network.Options{NetworkName: c.Name, Bridge: c.Bridge, Subnet: subnet, ProxyPort: c.ProxyPort,
		TransparentHTTPPort: c.TransparentHTTPPort, TransparentHTTPSPort: c.TransparentHTTPSPort}, nil
}

// sandboxDefaults turns the [sandbox] section into the pools' default limits.
func sandboxDefaults(c config.Sandbox) (pool.Limits, error) {
	l := pool.Limits{CPUs: c.CPUs, Pids: c.Pids}
	var err error
	if l.MemoryBytes, err = c.MemoryBytes(); err != nil {
		return l, err
	}
	if l.DiskBytes, err = c.DiskBytes(); err != nil {
		return l, err
	}
	return l, l.Validate("config [sandbox]")
}

// initBinaryPath returns the flag's value, or deltabox-init next to this executable.
func initBinaryPath(flag string) string {
	if flag != "" {
		return flag
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "deltabox-init")
}

// serveMetrics serves /metrics on addr (TCP) until ctx ends; an empty addr disables it.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry) error {
	if addr == "" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	context.AfterFunc(ctx, func() { srv.Close() })
	return nil
}

// lookupGroup resolves the socket group (name or gid); -1 means root only.
func lookupGroup(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	if gid, err := strconv.Atoi(name); err == nil {
		return gid, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("socket_group %q: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}

func newLogger(cfg config.Log, w interface{ Write([]byte) (int, error) }) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// egressOptions translates the [egress] section.
func egressOptions(e config.Egress) orchestrator.EgressOptions {
	return orchestrator.EgressOptions{
		UpstreamCAFile: e.UpstreamCAFile, BodyLimit: e.BodyLimit,
		CommitAttempts: e.CommitAttempts, CommitTimeout: e.CommitTimeout.Duration,
		CommitBackoff: e.CommitBackoff.Duration, CommitBackoffMax: e.CommitBackoffMax.Duration,
		MaxConnections: e.MaxConnections, HeaderTimeout: e.HeaderTimeout.Duration,
		BodyTimeout: e.BodyTimeout.Duration, IdleTimeout: e.IdleTimeout.Duration,
	}
}
