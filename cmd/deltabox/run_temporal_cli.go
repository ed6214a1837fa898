//go:build cli

package main

import (
	"context"
	"fmt"

	"github.com/deltabox/deltabox/pipeline"
)

// handOverEngine: the cli build does not link the Temporal SDK (lite.go); a run on Temporal
// replaces this process with the full build and the same arguments.
func handOverEngine(e *engineSpec) error {
	if e == nil {
		return nil
	}
	return execFullBinary()
}

// runOnTemporal is never reached in the cli build (handOverEngine replaced the process).
func runOnTemporal(context.Context, *engineSpec, *pipeline.Pipeline, []pipeline.Task, map[int]pipeline.Result,
	func(pipeline.Result) error, runOptions) (pipeline.Summary, error) {
	return pipeline.Summary{}, fmt.Errorf("--engine temporal needs %s", daemonBinary)
}
