package api

import "time"

// Step is one exec in a leased sandbox, recorded against the checkpoint it ran after (the
// head when it started): docs/time-travel.md.
type Step struct {
	Seq        int         `json:"seq"`        // per sandbox, from 1
	Checkpoint string      `json:"checkpoint"` // the head when it started
	Argv       []string    `json:"argv"`
	Workdir    string      `json:"workdir,omitempty"`
	Started    time.Time   `json:"started"`
	DurationMS float64     `json:"duration_ms"`
	Exit       *ExitStatus `json:"exit,omitempty"` // nil when the exec failed to run (Error)
	Error      string      `json:"error,omitempty"`
	// StdoutHead/Tail and StderrHead/Tail are the first and last bytes of each stream
	// (at most [steps] output_bytes each; Tail is empty when Head holds everything).
	StdoutHead  string `json:"stdout_head"`
	StdoutTail  string `json:"stdout_tail,omitempty"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrHead  string `json:"stderr_head"`
	StderrTail  string `json:"stderr_tail,omitempty"`
	StderrBytes int64  `json:"stderr_bytes"`
}

// Storyboard is a sandbox's history: `deltabox log`. Entries follow the current branch from
// the first checkpoint down to the head, or (all) every checkpoint of the tree in ID order.
type Storyboard struct {
	Sandbox string       `json:"sandbox"`
	Head    string       `json:"head"`
	Entries []StoryEntry `json:"entries"`
}

// StoryEntry is one checkpoint with what led to it (its state ops) and what happened after it
// until the next checkpoint: the commands run and the effects the sandbox's requests made.
type StoryEntry struct {
	Checkpoint Checkpoint   `json:"checkpoint"`
	StateOps   []StateEntry `json:"state_ops"` // from its parent to it
	Steps      []Step       `json:"steps"`     // run after it
	Effects    []Effect     `json:"effects"`   // recorded after it, with their decisions (status)
}

// FileInfo describes a path of a sandbox's tree as of a checkpoint (`deltabox show`).
type FileInfo struct {
	Path   string `json:"path"`
	Kind   string `json:"kind"` // file, dir, symlink, fifo, char, block, socket
	Mode   uint32 `json:"mode"`
	Size   int64  `json:"size"`
	Target string `json:"target,omitempty"` // symlink target
}

// PinRequest is the body of POST /v1/sandboxes/{id}/checkpoints/{ckpt}/pin.
type PinRequest struct {
	Pinned bool `json:"pinned"`
}
