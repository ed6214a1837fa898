package pipeline

import (
	"context"
	"fmt"
	"os"
	"time"
)

// This file is what another engine (pipeline/temporal, which runs every task as a Temporal
// workflow spread over many nodes) needs to run the same pipeline files with the same
// semantics: the pipeline as a self-contained bundle, the task rebuilt from its line, and
// the per-sandbox units of work (lease, copy files, one attempt of a step) the local engine
// is made of.

// Bundle is a pipeline file with the files it copies into every sandbox, so that a node that
// does not have them can parse and run it. ParseBundle(p.Bundle()) is p.
type Bundle struct {
	Source string            `json:"source"`
	YAML   []byte            `json:"yaml"`
	Files  map[string][]byte `json:"files,omitempty"` // by src as written in the file
}

// Bundle returns the pipeline's file and the data of its files.
func (p *Pipeline) Bundle() Bundle {
	b := Bundle{Source: p.Source, YAML: p.raw, Files: map[string][]byte{}}
	for _, f := range p.Files {
		b.Files[f.Src] = f.data
	}
	return b
}

// ParseBundle parses and validates a bundled pipeline: as Parse, but the files come from the
// bundle, not from the disk.
func ParseBundle(b Bundle) (*Pipeline, error) {
	return parse(b.Source, b.YAML, func(src string) ([]byte, error) {
		data, ok := b.Files[src]
		if !ok {
			return nil, fmt.Errorf("%s: not in the pipeline bundle: %w", src, os.ErrNotExist)
		}
		return data, nil
	})
}

// TaskFromLine rebuilds a task from its index, line number and JSON line (Task.Raw).
func TaskFromLine(source string, index, line int, raw string) Task {
	t := parseTask(source, index, line, raw)
	if line == 0 {
		t.Line = 0
	}
	return t
}

// StepAt returns step i of the pipeline and its fallback (nil when it has none).
func (p *Pipeline) StepAt(i int) (s, fallback *Step) {
	if i < 0 || i >= len(p.Steps) {
		return nil, nil
	}
	return p.Steps[i], p.Steps[i].fb
}

// Sandbox is one task's sandbox for another engine's units of work.
type Sandbox struct {
	C      Client
	P      *Pipeline
	T      Task
	ID     string            // the sandbox, once leased
	Start  time.Time         // the task's start (DELTABOX_TASK_START)
	Labels map[string]string // added to the lease's labels
}

func (sb *Sandbox) taskRun() *taskRun {
	r := &runner{c: sb.C, p: sb.P, opts: Options{LeaseTimeout: 10 * time.Minute, Labels: sb.Labels}}
	res := &Result{Index: sb.T.Index, ID: sb.T.ID, Seed: TaskSeed(sb.P.SeedValue(), sb.T.Index)}
	return &taskRun{r: r, t: sb.T, res: res, sb: sb.ID, start: sb.Start}
}

// Lease takes a sandbox from the pipeline's pool, waiting up to timeout while the pool is at
// its max, and copies the pipeline's files into it.
func (sb *Sandbox) Lease(ctx context.Context, timeout time.Duration) error {
	tr := sb.taskRun()
	tr.r.opts.LeaseTimeout = timeout
	if err := tr.lease(ctx); err != nil {
		return err
	}
	sb.ID = tr.sb
	return tr.copyFiles(ctx)
}

// CheckpointMessage is the message of the checkpoint a step starts from.
func (sb *Sandbox) CheckpointMessage(s *Step) string {
	return fmt.Sprintf("pipeline %s task %d (%s) step %s seed %d", sb.P.DisplayName(), sb.T.Index, sb.T.ID, s.Name,
		TaskSeed(sb.P.SeedValue(), sb.T.Index))
}

// Attempt runs step s once (command, then state patch); an error says why it failed.
func (sb *Sandbox) Attempt(ctx context.Context, s *Step, attempt int) error {
	return sb.taskRun().attempt(ctx, s, attempt)
}

// CountEffects counts a sandbox's effects by status.
func (sb *Sandbox) CountEffects(ctx context.Context) EffectCounts {
	tr := &taskRun{r: &runner{c: sb.C}, sb: sb.ID}
	return tr.effects(ctx)
}

// AddTimings records checkpoint and rollback round trips measured by another engine, for
// the summary's percentiles.
func (r *Result) AddTimings(checkpointMS, rollbackMS []float64) {
	r.checkpointMS = append(r.checkpointMS, checkpointMS...)
	r.rollbackMS = append(r.rollbackMS, rollbackMS...)
}

// NewSummary starts the summary of a run of tasks tasks.
func NewSummary(p *Pipeline, tasks int) Summary {
	return Summary{Pipeline: p.DisplayName(), Tasks: tasks}
}

// Add counts one task's result.
func (s *Summary) Add(r Result) { s.add(r) }

// SkipDone returns the tasks that done (results of an earlier run, by task index) did not
// finish, counting the others as skipped.
func (s *Summary) SkipDone(tasks []Task, done map[int]Result) []Task {
	var todo []Task
	for _, t := range tasks {
		if d, ok := done[t.Index]; ok && d.ID == t.ID {
			s.Skipped++
			continue
		}
		todo = append(todo, t)
	}
	return todo
}

// Record counts res and hands it to onResult (nil: none) unless an earlier call failed;
// *sinkErr keeps the first failure. False stops the run. Callers serialize the calls.
func (s *Summary) Record(res Result, onResult func(Result) error, sinkErr *error) bool {
	s.add(res)
	if onResult == nil || *sinkErr != nil {
		return *sinkErr == nil
	}
	if err := onResult(res); err != nil {
		*sinkErr = fmt.Errorf("record result of task %d: %w", res.Index, err)
		return false
	}
	return true
}

// Finish computes the percentiles and the duration since start.
func (s *Summary) Finish(start time.Time) { s.finish(start) }

// Ms is d in milliseconds, rounded to the microsecond.
func Ms(d time.Duration) float64 { return ms(d) }
