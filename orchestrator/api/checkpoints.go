package api

import (
	"encoding/json"
	"time"
)

// Checkpoint levels.
const (
	LevelL1 = "l1" // delta: what changed since the previous checkpoint
	LevelL2 = "l2" // full copy of the upper dir and the state document
	LevelL3 = "l3" // process memory too (CRIU)
)

// CheckpointRequest is the body of POST /v1/sandboxes/{id}/checkpoints.
type CheckpointRequest struct {
	Level   string `json:"level,omitempty"` // default l1
	Message string `json:"message,omitempty"`
	// Name is a reference to the checkpoint besides its ID (docs/time-travel.md): letters,
	// digits, '.', '_', '-', not only digits, at most 64 bytes. Names need not be unique; a
	// reference to a name several checkpoints carry is refused as ambiguous.
	Name string `json:"name,omitempty"`
	Pin  bool   `json:"pin,omitempty"` // retention never drops it
	// Processes keeps the sandbox's processes too (l1/l2): a stopped copy-on-write template
	// of each, from which a rollback starts fresh copies. Default: the pool's
	// checkpoint_processes.
	Processes *bool `json:"processes,omitempty"`
	// Async returns as soon as the sandbox runs again; the checkpoint is made durable in the
	// background, and every later operation on the sandbox waits for it.
	Async bool `json:"async,omitempty"`
}

// CheckpointProcess says how a checkpoint keeps one process of the sandbox.
type CheckpointProcess struct {
	Pid    int    `json:"pid"`  // in the sandbox's pid namespace, at the checkpoint
	Comm   string `json:"comm"` // its command name
	Kept   string `json:"kept"` // "template", "criu" or "none"
	Reason string `json:"reason,omitempty"`
}

// How a checkpoint keeps a process (CheckpointProcess.Kept).
const (
	KeptTemplate = "template" // a stopped copy-on-write fork; rollback forks a fresh copy
	KeptCRIU     = "criu"     // a CRIU dump; rollback restores it
	KeptNone     = "none"     // not kept (Reason says why); rollback cannot bring it back
)

// Checkpoint describes one checkpoint of a sandbox.
type Checkpoint struct {
	ID               string    `json:"checkpoint"`
	Sandbox          string    `json:"sandbox"`
	Level            string    `json:"level"`
	Parent           string    `json:"parent,omitempty"`
	Message          string    `json:"message,omitempty"`
	Created          time.Time `json:"created"`
	StateSeq         uint64    `json:"state_seq"`
	EffectsWatermark uint64    `json:"effects_watermark"`
	FilesChanged     int       `json:"files_changed"`
	Bytes            int64     `json:"bytes"`
	FrozenMS         float64   `json:"frozen_ms"`
	TotalMS          float64   `json:"total_ms"`
	Committed        bool      `json:"committed,omitempty"` // at or before the commit point
	Name             string    `json:"name,omitempty"`
	Pinned           bool      `json:"pinned,omitempty"`
	Head             bool      `json:"head,omitempty"` // the sandbox is at this checkpoint or after it (reference @)
	// Processes lists the processes a checkpoint taken with processes keeps, and how
	// (absent for checkpoints of files only); TemplateBytes is the memory their templates
	// hold alone now (pages changed since by the sandbox).
	Processes     []CheckpointProcess `json:"processes,omitempty"`
	TemplateBytes int64               `json:"template_bytes,omitempty"`
}

// RollbackRequest is the body of POST /v1/sandboxes/{id}/rollback.
type RollbackRequest struct {
	// To is a reference (docs/time-travel.md): an ID, a name, "@" (the head), "@~N" (N steps
	// up from the head) or "lease". Default: the head. Any checkpoint of the tree.
	To    string `json:"to,omitempty"`
	Force bool   `json:"force,omitempty"`
	// Replay: requests the egress policy records get the answers recorded for identical
	// requests instead of new ones, until a rollback without it (docs/time-travel.md).
	Replay bool `json:"replay,omitempty"`
}

// RollbackResult reports what a rollback undid.
type RollbackResult struct {
	ID               string `json:"sandbox"`
	To               string `json:"to"`
	From             string `json:"from,omitempty"` // the head before the rollback
	FilesRestored    int    `json:"files_restored"`
	OpsUndone        int    `json:"ops_undone"`
	EffectsDropped   int    `json:"effects_dropped"`
	ProcessesStopped int    `json:"processes_stopped"`
	// ProcessesRestored counts the processes started again from the target's templates;
	// ProcessesLost lists those the target kept but this rollback could not bring back.
	ProcessesRestored int                 `json:"processes_restored"`
	ProcessesLost     []CheckpointProcess `json:"processes_lost,omitempty"`
	FrozenMS          float64             `json:"frozen_ms"`
	TotalMS           float64             `json:"total_ms"`
}

// CommitResult reports a commit.
type CommitResult struct {
	ID              string `json:"sandbox"`
	Checkpoint      string `json:"checkpoint"` // rollbacks may not go to this or earlier ones
	EffectsReleased int    `json:"effects_released"`
	EffectsFailed   int    `json:"effects_failed"`
}

// FileChange is one path in a diff.
type FileChange struct {
	Path   string `json:"path"`
	Change string `json:"change"` // added | modified | deleted
	Kind   string `json:"kind"`
	Size   int64  `json:"size"`
}

// StateEntry is one logged state op with its inverse.
type StateEntry struct {
	Seq        uint64            `json:"seq"`
	Checkpoint string            `json:"checkpoint"`
	Op         json.RawMessage   `json:"op"`
	Inverse    []json.RawMessage `json:"inverse"`
	Time       time.Time         `json:"time"`
}

// Diff is what changed between two checkpoints (or a checkpoint and now).
type Diff struct {
	ID      string       `json:"sandbox"`
	From    string       `json:"from"`
	To      string       `json:"to"` // "" = now
	Files   []FileChange `json:"files"`
	State   []StateEntry `json:"state"`
	Effects []Effect     `json:"effects"`
}

// Effect is an outbound request seen by the egress proxy.
type Effect struct {
	ID             string    `json:"effect"`
	Seq            uint64    `json:"seq"`
	Checkpoint     string    `json:"checkpoint"`
	Method         string    `json:"method"`
	URL            string    `json:"url"`
	Status         string    `json:"status"`
	ResponseStatus int       `json:"response_status,omitempty"`
	Attempts       int       `json:"attempts,omitempty"`
	Created        time.Time `json:"created"`
	Error          string    `json:"error,omitempty"` // the last attempt's error
	// History is every delivery attempt's outcome, oldest first ([] if none).
	History []EffectAttempt `json:"history"`
	// NextAttempt is when a commit that is waiting to try again will (while it waits).
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	// Suspect: the sandbox's effect journal is damaged before this effect's state was last
	// recorded, so that state may be wrong; commits are refused until the operator decides.
	Suspect bool `json:"suspect,omitempty"`
	// Request is what the sandbox sent (GET .../effects/{effect} only, not in lists).
	Request *EffectRequest `json:"request,omitempty"`
}

// EffectRequest is the request an effect holds, as journaled; credentials (Authorization,
// Proxy-Authorization, Cookie) read "[redacted]".
type EffectRequest struct {
	Headers map[string][]string `json:"headers"`
	// Body is the body as text when it is UTF-8; otherwise BodyBase64 carries it.
	Body       string `json:"body,omitempty"`
	BodyBase64 []byte `json:"body_base64,omitempty"`
	Bytes      int    `json:"bytes"`
	// Compacted: the journal dropped the headers and body of this settled effect.
	Compacted bool `json:"compacted,omitempty"`
}

// StatePatchResult answers a state patch.
type StatePatchResult struct {
	Seq     uint64 `json:"seq"`
	Applied int    `json:"applied"`
}

// VerifyResult reports a consistency check; OK is false when Problems is not empty.
type VerifyResult struct {
	ID         string   `json:"sandbox"`
	Checkpoint string   `json:"checkpoint"`
	OK         bool     `json:"ok"`
	Problems   []string `json:"problems,omitempty"`
}
