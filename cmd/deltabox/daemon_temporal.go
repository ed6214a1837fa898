//go:build !cli

package main

import (
	"context"
	"crypto/tls"
	"log/slog"

	"github.com/deltabox/deltabox/internal/config"
	"github.com/deltabox/deltabox/pipeline/temporal"
)

// startTemporal runs the node's Temporal worker when [temporal] names an address; the
// returned function waits for it to stop once ctx has ended.
func startTemporal(ctx context.Context, cfg config.Config) (wait func(), err error) {
	t := cfg.Temporal
	if t.Address == "" {
		return func() {}, nil
	}
	var tlsCfg *tls.Config
	if t.TLS {
		if tlsCfg, err = temporal.TLSFiles(t.TLSCAFile, t.TLSCertFile, t.TLSKeyFile, t.TLSServerName); err != nil {
			return nil, err
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		temporal.RunWorker(ctx, temporal.WorkerConfig{
			Conn:   temporal.Conn{Address: t.Address, Namespace: t.Namespace, TLS: tlsCfg, Logger: slog.Default().With("component", "temporal-sdk")},
			Queues: t.TaskQueues, MaxTasks: t.MaxTasks, Socket: cfg.Address,
		})
	}()
	return func() { <-done }, nil
}
