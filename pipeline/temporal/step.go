package temporal

import (
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/deltabox/deltabox/pipeline"
)

// step runs step i and applies its failure policy; it returns the step that succeeded (the
// step or its fallback, nil when it was rolled back), and an error when the task fails.
func (w *taskFlow) step(i int) (*pipeline.Step, error) {
	s, fb := w.p.StepAt(i)
	sr, err := w.runStep(i, false, s, "")
	k := len(w.res.Steps)
	w.res.Steps = append(w.res.Steps, sr)
	if err != nil {
		return nil, err
	}
	if sr.Status == pipeline.StatusSucceeded {
		return s, nil
	}
	switch s.OnFailure.Action {
	case pipeline.OnFailureRollbackContinue:
		w.res.Steps[k].Status = pipeline.StatusRolledBack
		return nil, nil
	case pipeline.OnFailureFallback:
		fr, err := w.runStep(i, true, fb, s.Name)
		w.res.Steps = append(w.res.Steps, fr)
		if err != nil {
			return nil, err
		}
		if fr.Status != pipeline.StatusSucceeded {
			return nil, fmt.Errorf("step %q failed (%s) and so did its fallback %q: %s", s.Name, sr.Error, fr.Name, fr.Error)
		}
		w.res.Steps[k].Status = pipeline.StatusRecovered
		return fb, nil
	}
	return nil, fmt.Errorf("step %q failed after %d attempt(s): %s", s.Name, sr.Attempts, sr.Error)
}

// runStep takes the step's checkpoint and runs it up to Retry.Attempts times, rolling back
// after each failure and waiting the backoff (a durable timer) before the next attempt.
func (w *taskFlow) runStep(i int, fallback bool, s *pipeline.Step, fallbackFor string) (sr pipeline.StepResult, err error) {
	start := workflow.Now(w.root)
	sr = pipeline.StepResult{Name: s.Name, Status: pipeline.StatusFailed, FallbackFor: fallbackFor}
	defer func() { sr.DurationMS = pipeline.Ms(workflow.Now(w.root).Sub(start)) }()
	for attempt := 1; ; attempt++ {
		in := AttemptInput{Task: w.in, Start: w.start, Sandbox: w.sb, Step: i, Fallback: fallback, Attempt: attempt}
		if attempt == 1 {
			sb := pipeline.Sandbox{P: w.p, T: w.t}
			in.Checkpoint = &CheckpointInput{Level: s.Checkpoint, Message: sb.CheckpointMessage(s)}
		}
		var ar AttemptResult
		err := w.call(actAttempt, in, &ar)
		if attempt == 1 {
			if ar.Checkpoint.ID == "" {
				return sr, fmt.Errorf("checkpoint before step %q: %w", s.Name, err)
			}
			sr.Checkpoint = w.checkpointed(ar.Checkpoint)
		}
		sr.Attempts = attempt
		w.res.Attempts++
		w.at = ""
		if err != nil {
			return sr, fmt.Errorf("step %q: %w", s.Name, err)
		}
		if ar.Error == "" {
			sr.Status = pipeline.StatusSucceeded
			return sr, nil
		}
		w.res.Failures++
		sr.Error = fmt.Sprintf("attempt %d: %s", attempt, ar.Error)
		if err := w.rollback(sr.Checkpoint); err != nil {
			return sr, fmt.Errorf("step %q: %w", s.Name, err)
		}
		if attempt >= s.Retry.Attempts {
			return sr, nil
		}
		if err := workflow.Sleep(w.root, s.Retry.Backoff<<(attempt-1)); err != nil {
			return sr, fmt.Errorf("step %q: %w", s.Name, err)
		}
	}
}

// checkpointed records the checkpoint a step's first attempt took.
func (w *taskFlow) checkpointed(ck Checkpointed) string {
	w.ckMS = append(w.ckMS, ck.MS)
	w.res.Checkpoints++
	if w.floor == "" {
		w.floor = ck.ID
	}
	w.at, w.pending = ck.ID, true
	return ck.ID
}

// rollback returns the sandbox to checkpoint ck.
func (w *taskFlow) rollback(ck string) error {
	var ms float64
	if err := w.call(actRollback, RollbackInput{Sandbox: w.sb, Checkpoint: ck}, &ms); err != nil {
		return fmt.Errorf("roll back to checkpoint %s: %w", ck, err)
	}
	w.rbMS = append(w.rbMS, ms)
	w.res.Rollbacks++
	w.at = ck
	return nil
}
