package api

import "time"

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots (push) and, with Count,
// of POST /v1/sandboxes/{id}/fork.
type SnapshotRequest struct {
	To    string `json:"to,omitempty"`    // object store URI; default: the daemon's store
	Count int    `json:"count,omitempty"` // fork only: restores to make
	// KeepSnapshot (fork only) keeps the snapshot the fork pushed; by default it is removed
	// once the forks are restored.
	KeepSnapshot bool `json:"keep_snapshot,omitempty"`
	// From (fork only) forks from a checkpoint of the sandbox (a reference: ID, name, @, @~N,
	// lease) on this node, without a snapshot: the forks get its files, state and a fresh
	// identity, their processes start fresh (docs/time-travel.md).
	From string `json:"from,omitempty"`
	// Replay (with From): the forks get the source's recorded answers and replay them.
	Replay bool `json:"replay,omitempty"`
}

// RestoreRequest is the body of POST /v1/restore.
type RestoreRequest struct {
	URI  string `json:"uri"`            // STORE#NAME, or NAME in the daemon's store
	Pool string `json:"pool,omitempty"` // default: the snapshot's pool name; it must exist here
	// AdoptHeldEffects makes the effects the snapshot's sandbox held (at its checkpoint) held
	// effects of the restored sandbox, under the same IDs and so the same Idempotency-Keys:
	// the restore continues the sandbox (a task moving to another node) rather than forking
	// it. Default: the restored sandbox starts with no held effects.
	AdoptHeldEffects bool `json:"adopt_held_effects,omitempty"`
}

// Snapshot describes an L3 snapshot in an object store.
type Snapshot struct {
	Name        string    `json:"name"`
	URI         string    `json:"uri"` // STORE#NAME: what restore takes
	Sandbox     string    `json:"sandbox"`
	Checkpoint  string    `json:"checkpoint"`
	Created     time.Time `json:"created"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	CRIUVersion int       `json:"criu_version"`
	Kernel      string    `json:"kernel"`
	Arch        string    `json:"arch"`
	Size        int64     `json:"size"`               // bytes of all blobs
	Uploaded    int64     `json:"uploaded,omitempty"` // bytes actually sent (unchanged blobs are skipped)
	FrozenMS    float64   `json:"frozen_ms,omitempty"`
	DumpMS      float64   `json:"dump_ms,omitempty"`
	PackageMS   float64   `json:"package_ms,omitempty"`
	UploadMS    float64   `json:"upload_ms,omitempty"`
}

// Progress reports the advance of a push, restore or fork.
type Progress struct {
	Phase string `json:"phase"` // checkpoint, package, upload, download, restore
	Blob  string `json:"blob,omitempty"`
	Done  int64  `json:"done"`
	Total int64  `json:"total"`
}

// StreamEvent is one JSON line of a push, restore or fork response: progress events, then
// exactly one final event carrying the result or an error.
type StreamEvent struct {
	Progress *Progress `json:"progress,omitempty"`
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	Leases   []Lease   `json:"leases,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}
