package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// stderrTail is how much of a failed command's stderr its error keeps.
const stderrTail = 512

// step runs one step and applies its failure policy; an error fails the task.
func (tr *taskRun) step(ctx context.Context, s *Step) error {
	sr, err := tr.runStep(ctx, s, "")
	i := len(tr.res.Steps)
	tr.res.Steps = append(tr.res.Steps, sr)
	if err != nil || sr.Status == StatusSucceeded {
		return err
	}
	switch s.OnFailure.Action {
	case OnFailureRollbackContinue:
		tr.res.Steps[i].Status = StatusRolledBack
		return nil
	case OnFailureFallback:
		fb, err := tr.runStep(ctx, s.fb, s.Name)
		tr.res.Steps = append(tr.res.Steps, fb)
		if err != nil {
			return err
		}
		if fb.Status != StatusSucceeded {
			return fmt.Errorf("step %q failed (%s) and so did its fallback %q: %s", s.Name, sr.Error, fb.Name, fb.Error)
		}
		tr.res.Steps[i].Status = StatusRecovered
		return nil
	}
	return fmt.Errorf("step %q failed after %d attempt(s): %s", s.Name, sr.Attempts, sr.Error)
}

// runStep takes the step's checkpoint and runs it up to Retry.Attempts times, rolling back to
// the checkpoint after each failure. A step that failed every attempt has status failed; an
// error means the task cannot go on (checkpoint, rollback or commit failed, or ctx ended).
func (tr *taskRun) runStep(ctx context.Context, s *Step, fallbackFor string) (sr StepResult, err error) {
	start := time.Now()
	sr = StepResult{Name: s.Name, Status: StatusFailed, FallbackFor: fallbackFor}
	defer func() { sr.DurationMS = msSince(start) }()
	ctx = log.With(ctx, "step", s.Name)
	if sr.Checkpoint, err = tr.checkpoint(ctx, s); err != nil {
		return sr, err
	}
	for attempt := 1; ; attempt++ {
		sr.Attempts = attempt
		tr.res.Attempts++
		aerr := tr.attempt(ctx, s, attempt)
		if aerr == nil {
			sr.Status = StatusSucceeded
			if s.Commit == CommitStep {
				return sr, tr.commit(ctx)
			}
			return sr, nil
		}
		if ctx.Err() != nil {
			return sr, fmt.Errorf("step %q: %w", s.Name, ctx.Err())
		}
		tr.res.Failures++
		sr.Error = fmt.Sprintf("attempt %d: %v", attempt, aerr)
		log.L(ctx).Debug("step attempt failed", "attempt", attempt, "error", aerr)
		if err := tr.rollback(ctx, sr.Checkpoint); err != nil {
			return sr, fmt.Errorf("step %q: %w", s.Name, err)
		}
		if attempt >= s.Retry.Attempts {
			return sr, nil
		}
		if err := sleep(ctx, s.Retry.Backoff<<(attempt-1)); err != nil {
			return sr, fmt.Errorf("step %q: %w", s.Name, err)
		}
	}
}

// templateData is what the step's templates see on this attempt.
func (tr *taskRun) templateData(s *Step, attempt int) TemplateData {
	return TemplateData{Task: tr.t.Fields, Index: tr.t.Index, ID: tr.t.ID, Seed: tr.res.Seed,
		Pipeline: tr.r.p.DisplayName(), Step: s.Name, Attempt: attempt}
}

// attempt runs the step's command once and, when it succeeds, applies its state patch.
func (tr *taskRun) attempt(ctx context.Context, s *Step, attempt int) error {
	data := tr.templateData(s, attempt)
	req, err := tr.execRequest(s, data)
	if err != nil {
		return err
	}
	stdout, stderr, done := tr.outputs(s, attempt)
	defer done()
	tr.at = ""
	st, err := tr.r.c.Exec(ctx, tr.sb, req, nil, stdout, stderr)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if err := exitError(st, stderr.tail()); err != nil {
		return err
	}
	ops, err := s.statePatch(data)
	if err != nil || ops == nil {
		return err
	}
	if _, err := tr.r.c.StatePatch(ctx, tr.sb, ops, -1); err != nil {
		return fmt.Errorf("state patch %s: %w", ops, err)
	}
	return nil
}

// execRequest renders the step's command and environment for one attempt.
func (tr *taskRun) execRequest(s *Step, data TemplateData) (api.ExecRequest, error) {
	argv, err := s.argv(data)
	if err != nil {
		return api.ExecRequest{}, fmt.Errorf("render command: %w", err)
	}
	env, err := s.env(data)
	if err != nil {
		return api.ExecRequest{}, fmt.Errorf("render env: %w", err)
	}
	env = append(env, "DELTABOX_STEP="+s.Name, "DELTABOX_ATTEMPT="+strconv.Itoa(data.Attempt))
	if s.FreshRandom {
		env = append(env, randomEnv(attemptSeed(tr.res.Seed, s.index, data.Attempt), time.Now())...)
	}
	return api.ExecRequest{Argv: argv, Env: env, Workdir: s.Workdir, TimeoutMS: float64(s.Timeout) / float64(time.Millisecond)}, nil
}

// outputs returns the attempt's stdout and stderr writers (stderr keeps a tail for errors)
// and a function that closes what Options.Output opened.
func (tr *taskRun) outputs(s *Step, attempt int) (io.Writer, *tailWriter, func()) {
	stderr := &tailWriter{max: stderrTail}
	if tr.r.opts.Output == nil {
		return io.Discard, stderr, func() {}
	}
	w := tr.r.opts.Output(tr.t, s.Name, attempt)
	stderr.also = w
	return w, stderr, func() {
		if c, ok := w.(io.Closer); ok {
			_ = c.Close()
		}
	}
}

// exitError describes a command that did not exit 0.
func exitError(st api.ExitStatus, tail string) error {
	var why string
	switch {
	case st.Error != "":
		why = "did not start: " + st.Error
	case st.TimedOut:
		why = "timed out"
	case st.Signal != "":
		why = "killed by " + st.Signal
	case st.Code != 0:
		why = "exit code " + strconv.Itoa(st.Code)
	default:
		return nil
	}
	if tail = strings.TrimSpace(tail); tail != "" {
		why += ": " + tail
	}
	return fmt.Errorf("command %s", why)
}

// tailWriter keeps the last max bytes written to it and passes everything on to also.
type tailWriter struct {
	max  int
	buf  bytes.Buffer
	also io.Writer
}

func (w *tailWriter) Write(p []byte) (int, error) {
	if w.also != nil {
		if _, err := w.also.Write(p); err != nil {
			return 0, err
		}
	}
	w.buf.Write(p)
	if over := w.buf.Len() - w.max; over > 0 {
		w.buf.Next(over)
	}
	return len(p), nil
}

func (w *tailWriter) tail() string { return w.buf.String() }
