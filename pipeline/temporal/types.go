package temporal

import (
	"time"

	"github.com/deltabox/deltabox/pipeline"
)

// Names under which the worker registers the workflow and its activities.
const (
	WorkflowName       = "deltabox.PipelineTask"
	actAcquire         = "deltabox.Acquire"
	actAttempt         = "deltabox.Attempt"
	actRollback        = "deltabox.Rollback"
	actCommit          = "deltabox.Commit"
	actFailover        = "deltabox.FailoverPoint"
	actRelease         = "deltabox.Release"
	actRemoveSnapshots = "deltabox.RemoveSnapshots"
	DefaultQueue       = "deltabox"
	DefaultNS          = "default"
	defaultNodeTTL     = 10 * time.Second
)

// TaskInput is a task workflow's input: the pipeline (with its files) and the task.
type TaskInput struct {
	Pipeline    pipeline.Bundle `json:"pipeline"`
	TasksSource string          `json:"tasks_source"`
	Index       int             `json:"index"`
	Line        int             `json:"line"`
	Raw         string          `json:"raw"` // the task's JSON line
	// Queue is the shared task queue where a node with capacity takes the task.
	Queue string `json:"queue"`
	// NodeTimeout is how long a node may miss heartbeats before its tasks move.
	NodeTimeout time.Duration `json:"node_timeout"`
	// LeaseTimeout bounds the wait for a node with capacity and for a sandbox there.
	LeaseTimeout time.Duration `json:"lease_timeout"`
	// MaxFailovers bounds how often the task moves to another node.
	MaxFailovers int `json:"max_failovers"`
}

// TaskOutput is a task workflow's result.
type TaskOutput struct {
	Result       pipeline.Result `json:"result"`
	CheckpointMS []float64       `json:"checkpoint_ms"`
	RollbackMS   []float64       `json:"rollback_ms"`
}

// AcquireInput asks a node for the task's sandbox: a lease from the pipeline's pool, or a
// restore of Snapshot (a failover point).
type AcquireInput struct {
	Task     TaskInput `json:"task"`
	Start    time.Time `json:"start"`
	Snapshot string    `json:"snapshot,omitempty"`
}

// Acquired is the sandbox a node holds for the task.
type Acquired struct {
	Sandbox string `json:"sandbox"`
	Node    string `json:"node"`
}

// CheckpointInput is the checkpoint a step starts from.
type CheckpointInput struct {
	Level   string `json:"level"`
	Message string `json:"message"`
}

// Checkpointed is a taken checkpoint and its round trip.
type Checkpointed struct {
	ID string  `json:"id"`
	MS float64 `json:"ms"`
}

// AttemptInput runs one attempt of a step: Step indexes the pipeline's steps, Fallback
// selects that step's fallback.
type AttemptInput struct {
	Task     TaskInput `json:"task"`
	Start    time.Time `json:"start"`
	Sandbox  string    `json:"sandbox"`
	Step     int       `json:"step"`
	Fallback bool      `json:"fallback,omitempty"`
	Attempt  int       `json:"attempt"`
	// Checkpoint, on a step's first attempt, is the checkpoint the step starts from, taken
	// first in the same activity (one round trip through Temporal per step, not two).
	Checkpoint *CheckpointInput `json:"checkpoint,omitempty"`
}

// AttemptResult says why an attempt failed ("" when it succeeded), and which checkpoint it
// took first (when asked).
type AttemptResult struct {
	Error      string       `json:"error,omitempty"`
	Checkpoint Checkpointed `json:"checkpoint"`
}

// RollbackInput returns a sandbox to a checkpoint.
type RollbackInput struct {
	Sandbox    string `json:"sandbox"`
	Checkpoint string `json:"checkpoint"`
}

// Committed is a commit's outcome.
type Committed struct {
	Checkpoint    string `json:"checkpoint"`
	EffectsFailed int    `json:"effects_failed"`
}

// Released is what a sandbox held when it was released.
type Released struct {
	Effects pipeline.EffectCounts `json:"effects"`
}
