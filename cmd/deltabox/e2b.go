//go:build !cli

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/deltabox/deltabox/internal/config"
	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator"
	"github.com/deltabox/deltabox/orchestrator/e2b"
)

// serveE2B starts the E2B-compatible API on its own listener when [e2b] address is set; it
// stops with ctx. The config's validation already made TLS required off loopback.
func serveE2B(ctx context.Context, c config.E2B, o *orchestrator.Orchestrator) error {
	if c.Address == "" {
		return nil
	}
	keys, err := e2b.ReadKeys(c.APIKeysFile)
	if err != nil {
		return err
	}
	g, err := e2b.New(o, e2b.Options{Keys: keys, DefaultTimeout: c.DefaultTimeout.Duration, MaxTimeout: c.MaxTimeout.Duration})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", c.Address)
	if err != nil {
		return fmt.Errorf("e2b listener: %w", err)
	}
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		var err error
		if c.TLSCertFile != "" {
			err = srv.ServeTLS(l, c.TLSCertFile, c.TLSKeyFile)
		} else {
			err = srv.Serve(l)
		}
		if err != nil && err != http.ErrServerClosed {
			log.L(ctx).Error("e2b API stopped", "error", err)
		}
	}()
	context.AfterFunc(ctx, func() {
		g.Close(context.WithoutCancel(ctx))
		srv.Close()
	})
	log.L(ctx).Info("e2b API started", "address", l.Addr().String(), "tls", c.TLSCertFile != "", "keys", len(keys))
	return nil
}
