//go:build !cli

package main

import (
	"context"
	"crypto/tls"

	"github.com/deltabox/deltabox/pipeline"
	"github.com/deltabox/deltabox/pipeline/temporal"
)

// runOnTemporal runs the pipeline's tasks as workflows on the nodes polling e's queue.
func runOnTemporal(ctx context.Context, e *engineSpec, p *pipeline.Pipeline, tasks []pipeline.Task,
	done map[int]pipeline.Result, onResult func(pipeline.Result) error, o runOptions) (pipeline.Summary, error) {
	conn := temporal.Conn{Address: e.address, Namespace: e.namespace}
	if e.tls {
		conn.TLS = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.serverName}
	}
	return temporal.Run(ctx, p, tasks, temporal.RunOptions{Conn: conn, Queue: e.queue, Parallel: o.parallel,
		Done: done, OnResult: onResult, RunKey: o.runKey, NodeTimeout: o.nodeTTL})
}
