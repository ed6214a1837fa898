package pipeline

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// Task and step statuses.
const (
	StatusSucceeded   = "succeeded"
	StatusFailed      = "failed"
	StatusInterrupted = "interrupted" // the run was cancelled; the task is not finished
	StatusRolledBack  = "rolled_back" // a step that failed and was undone (rollback_continue)
	StatusRecovered   = "recovered"   // a step that failed and whose fallback succeeded
)

// Result is one task's line in the results.
type Result struct {
	Index   int    `json:"index"`
	ID      string `json:"id"`
	Line    int    `json:"line,omitempty"`
	Status  string `json:"status"`
	Sandbox string `json:"sandbox,omitempty"`
	// Node is the daemon (its ID, as `deltabox info` shows it) the task ended on, and Nodes
	// every node it ran on, in order, when it failed over (Temporal engine only).
	Node        string       `json:"node,omitempty"`
	Nodes       []string     `json:"nodes,omitempty"`
	Failovers   int          `json:"failovers,omitempty"` // times it moved to another node
	Seed        uint32       `json:"seed"`
	Attempts    int          `json:"attempts"`    // step runs, retries included
	Failures    int          `json:"failures"`    // step runs that failed
	Rollbacks   int          `json:"rollbacks"`   // rollbacks made by the pipeline
	Checkpoints int          `json:"checkpoints"` // checkpoints taken by the pipeline
	Commits     int          `json:"commits"`
	Effects     EffectCounts `json:"effects"`
	DurationMS  float64      `json:"duration_ms"`
	Steps       []StepResult `json:"steps"`
	Error       string       `json:"error,omitempty"`

	checkpointMS, rollbackMS []float64
}

// StepResult is one step of a task.
type StepResult struct {
	Name        string  `json:"name"`
	Status      string  `json:"status"`
	Attempts    int     `json:"attempts"`
	Checkpoint  string  `json:"checkpoint,omitempty"`
	DurationMS  float64 `json:"duration_ms"`
	FallbackFor string  `json:"fallback_for,omitempty"`
	Error       string  `json:"error,omitempty"`
}

// EffectCounts are a sandbox's effects by status at the end of its task: held (still held,
// normally 0), committed (released by a commit), dropped (by a rollback), and the others.
type EffectCounts struct {
	Held        int `json:"held"`
	Committed   int `json:"committed"`
	Dropped     int `json:"dropped"`
	Failed      int `json:"failed,omitempty"`
	Passed      int `json:"passed,omitempty"`
	Compensated int `json:"compensated,omitempty"`
	Denied      int `json:"denied,omitempty"`
}

func countEffects(effects []api.Effect) EffectCounts {
	var c EffectCounts
	for _, e := range effects {
		switch e.Status {
		case "held":
			c.Held++
		case "released":
			c.Committed++
		case "dropped":
			c.Dropped++
		case "failed":
			c.Failed++
		case "passed":
			c.Passed++
		case "compensated":
			c.Compensated++
		case "denied":
			c.Denied++
		}
	}
	return c
}

func (c *EffectCounts) add(o EffectCounts) {
	c.Held += o.Held
	c.Committed += o.Committed
	c.Dropped += o.Dropped
	c.Failed += o.Failed
	c.Passed += o.Passed
	c.Compensated += o.Compensated
	c.Denied += o.Denied
}

// Finished reports whether the task reached an end (succeeded or failed).
func (r Result) Finished() bool { return r.Status == StatusSucceeded || r.Status == StatusFailed }

// Summary is the last line of a run: {"summary": {...}}.
type Summary struct {
	Pipeline     string       `json:"pipeline"`
	Tasks        int          `json:"tasks"`   // in the tasks file
	Skipped      int          `json:"skipped"` // already finished in the results file
	Succeeded    int          `json:"succeeded"`
	Failed       int          `json:"failed"`
	Interrupted  int          `json:"interrupted"` // started or waiting when the run was cancelled
	Steps        int          `json:"steps"`       // step runs that ended (fallbacks included)
	Attempts     int          `json:"attempts"`
	Failures     int          `json:"failures"` // failed attempts: injected or real failures seen
	Rollbacks    int          `json:"rollbacks"`
	Checkpoints  int          `json:"checkpoints"`
	Commits      int          `json:"commits"`
	Failovers    int          `json:"failovers,omitempty"` // Temporal engine: tasks moved to another node
	Effects      EffectCounts `json:"effects"`
	CheckpointMS Percentiles  `json:"checkpoint_ms"` // client-measured round trips
	RollbackMS   Percentiles  `json:"rollback_ms"`
	DurationMS   float64      `json:"duration_ms"`

	checkpointMS, rollbackMS []float64
}

// Percentiles of a set of latencies in milliseconds.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// add counts one task's result.
func (s *Summary) add(r Result) {
	switch r.Status {
	case StatusSucceeded:
		s.Succeeded++
	case StatusFailed:
		s.Failed++
	default:
		s.Interrupted++
	}
	s.Steps += len(r.Steps)
	s.Attempts += r.Attempts
	s.Failures += r.Failures
	s.Rollbacks += r.Rollbacks
	s.Checkpoints += r.Checkpoints
	s.Commits += r.Commits
	s.Failovers += r.Failovers
	s.Effects.add(r.Effects)
	s.checkpointMS = append(s.checkpointMS, r.checkpointMS...)
	s.rollbackMS = append(s.rollbackMS, r.rollbackMS...)
}

func (s *Summary) finish(start time.Time) {
	s.CheckpointMS = percentiles(s.checkpointMS)
	s.RollbackMS = percentiles(s.rollbackMS)
	s.DurationMS = msSince(start)
}

// percentiles uses the nearest-rank method.
func percentiles(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	v = slices.Clone(v)
	slices.Sort(v)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(v)))) - 1
		return v[max(0, min(i, len(v)-1))]
	}
	return Percentiles{N: len(v), P50: rank(0.50), P99: rank(0.99), Max: v[len(v)-1]}
}

func msSince(t time.Time) float64 { return ms(time.Since(t)) }

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }

// ReadFinished reads a results file and returns the finished tasks by index. Lines that are
// not results (the summary, a line torn by a crash) are ignored; a missing file is empty.
func ReadFinished(path string) (map[int]Result, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[int]Result{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open results: %w", err)
	}
	defer f.Close()
	return readFinished(f)
}

func readFinished(r io.Reader) (map[int]Result, error) {
	done := map[int]Result{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var res Result
		if json.Unmarshal(sc.Bytes(), &res) == nil && res.Finished() {
			done[res.Index] = res
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	return done, nil
}
