package api

import "time"

// Template is a named sandbox recipe and the size of its warm pool (POST /v1/pools).
type Template struct {
	Name         string            `json:"name"`
	Image        string            `json:"image"`
	CPUs         float64           `json:"cpus,omitempty"`         // CPU quota in cores (0: the node default)
	MemoryBytes  int64             `json:"memory_bytes,omitempty"` // memory limit (0: the node default)
	Pids         int64             `json:"pids,omitempty"`         // pids limit (0: the node default)
	DiskBytes    int64             `json:"disk_bytes,omitempty"`   // writable layer size (0: the node default)
	Env          []string          `json:"env,omitempty"`          // KEY=VALUE for every process
	Workdir      string            `json:"workdir,omitempty"`      // default working directory of execs
	Labels       map[string]string `json:"labels,omitempty"`
	EgressPolicy string            `json:"egress_policy,omitempty"` // policy document (YAML), used by the egress proxy
	// NoUserNamespace runs the pool's sandboxes without a user namespace: root inside is
	// host root (weaker; docs/security.md).
	NoUserNamespace bool `json:"no_user_namespace,omitempty"`
	// CheckpointProcesses is the default of a checkpoint's processes flag (keep the
	// processes as templates, docs/process-templates.md) for the pool's sandboxes.
	CheckpointProcesses bool `json:"checkpoint_processes,omitempty"`
	MinReady            int  `json:"min_ready"`
	Max                 int  `json:"max"`
}

// PoolInfo is a pool's template and counts, with the limits (the template's over the node
// defaults) and isolation its sandboxes get.
type PoolInfo struct {
	Template
	Ready     int       `json:"ready"`
	Creating  int       `json:"creating"`
	Leased    int       `json:"leased"`
	Limits    Limits    `json:"limits"`
	Isolation Isolation `json:"isolation"`
}

// Limits bound one sandbox's resources. A zero field is unlimited.
type Limits struct {
	CPUs        float64 `json:"cpus"`         // CPU quota in cores (cgroup cpu.max)
	MemoryBytes int64   `json:"memory_bytes"` // memory and memory+swap limit
	Pids        int64   `json:"pids"`         // most processes and threads
	DiskBytes   int64   `json:"disk_bytes"`   // size of the sandbox's writable layer
}

// Isolation is what confines a sandbox's processes.
type Isolation struct {
	Seccomp       string   `json:"seccomp"`        // seccomp profile name ("" = none)
	Capabilities  []string `json:"capabilities"`   // bounding = effective = permitted set
	UserNamespace bool     `json:"user_namespace"` // root in the sandbox is not root on the host
	// IDMapping is a sandbox's user namespace mapping, uids and gids alike (a sandbox's
	// view only).
	IDMapping *IDMapping `json:"id_mapping,omitempty"`
}

// IDMapping maps ids ContainerID..ContainerID+Size-1 in a sandbox onto host ids
// HostID..HostID+Size-1.
type IDMapping struct {
	ContainerID uint32 `json:"container_id"`
	HostID      uint32 `json:"host_id"`
	Size        uint32 `json:"size"`
}

// Sandbox is the public view of a leased sandbox.
type Sandbox struct {
	ID        string            `json:"sandbox"`
	Pool      string            `json:"pool"`
	Container string            `json:"container"`
	Image     string            `json:"image"`
	Env       []string          `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	LeasedAt  time.Time         `json:"leased_at"`
	Created   time.Time         `json:"created"`
	InitPid   uint32            `json:"init_pid"`
	IP        string            `json:"ip,omitempty"`
	// EgressPolicy is the lease's egress policy, or the template's.
	EgressPolicy string `json:"egress_policy,omitempty"`
	// RestoredFrom is the snapshot URI a restored sandbox came from; ForkedFrom is
	// "SANDBOX@CHECKPOINT" for a fork. Empty for a plain lease.
	RestoredFrom string `json:"restored_from,omitempty"`
	ForkedFrom   string `json:"forked_from,omitempty"`
	// State is "leased"; "failed" for a fenced sandbox (its init exited: Reason says how),
	// whose calls fail until it is released; or "quarantined" for a sandbox kept at start
	// because its record could not be trusted (Reason says why): not usable until adopted.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Limits and Isolation are what confines the sandbox (its pool's).
	Limits    Limits    `json:"limits"`
	Isolation Isolation `json:"isolation"`
}

// Sandbox states.
const (
	StateLeased      = "leased"
	StateQuarantined = "quarantined"
	StateFailed      = "failed"
)

// AdoptRequest asks to adopt a quarantined sandbox, into Pool ("" keeps the pool it was
// known by).
type AdoptRequest struct {
	Pool string `json:"pool,omitempty"`
}

// LeaseResult is a leased sandbox and whether it was created for the lease (cold).
type LeaseResult struct {
	Sandbox
	Cold bool `json:"cold"`
}

// ExitStatus is the outcome of an exec.
type ExitStatus struct {
	// Code is the exit code; 128+N when killed by signal N; 127/126 when it did not start.
	Code int `json:"code"`
	// Signal names the signal that killed the command ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// TimedOut says the process group was killed because the timeout passed.
	TimedOut bool `json:"timed_out,omitempty"`
	// StdoutTruncated and StderrTruncated say output beyond OutputCap was dropped.
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
	// Error explains why the command could not be started; empty when it ran.
	Error string `json:"error,omitempty"`
	// Pid is the command's pid inside the sandbox (0 when it did not start).
	Pid int `json:"pid,omitempty"`
	// DurationMS is the wall time from start to exit in milliseconds, as seen by the init.
	DurationMS float64 `json:"duration_ms,omitempty"`
}

// ScaleRequest is the body of POST /v1/pools/{name}/scale.
type ScaleRequest struct {
	MinReady int `json:"min_ready"`
}

// LeaseRequest is the body of POST /v1/pools/{name}/lease.
type LeaseRequest struct {
	Env          []string          `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	EgressPolicy string            `json:"egress_policy,omitempty"` // YAML; overrides the pool's
}

// Lease is the answer to a lease.
type Lease struct {
	LeaseResult
	LeaseMS float64 `json:"lease_ms"`
}

// ExecRequest is the first line of the body of POST /v1/sandboxes/{id}/exec; when Stdin is
// set, the rest of the body is the command's standard input.
type ExecRequest struct {
	Argv      []string `json:"argv"`
	Env       []string `json:"env,omitempty"`
	Workdir   string   `json:"workdir,omitempty"`
	User      string   `json:"user,omitempty"`
	TimeoutMS float64  `json:"timeout_ms,omitempty"` // kill the process group after this long (0: never)
	OutputCap int64    `json:"output_cap,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`
	Tag       string   `json:"tag,omitempty"`
	Via       string   `json:"via,omitempty"` // "" (init, containerd as fallback), init, containerd
	// Detach starts the command and answers at once with its Proc; its output goes to the
	// proc's log (GET .../procs/{proc}/logs). Not with Stdin.
	Detach bool `json:"detach,omitempty"`
	// TTY is the initial window size of the command's terminal: only for
	// POST /v1/sandboxes/{id}/exec/tty, which requires it ({} takes 24x80).
	TTY *TTYSize `json:"tty,omitempty"`
}

// TTYSize is a terminal's window size in character cells.
type TTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// TTYInput is one JSON line of the body of POST /v1/sandboxes/{id}/exec/tty after the
// request line: bytes typed on the terminal (with Stdin set in the request), a new window
// size, or the end of the input (which types the terminal's EOF character, Ctrl-D). A line is
// at most MaxTTYInputLine bytes.
type TTYInput struct {
	Stdin  []byte   `json:"i,omitempty"`
	Resize *TTYSize `json:"resize,omitempty"`
	EOF    bool     `json:"eof,omitempty"`
}

// MaxTTYInputLine bounds one TTYInput line, newline included (32 KiB of input fit).
const MaxTTYInputLine = 64 << 10

// Proc is a detached exec: its ID within the sandbox, what it runs and how it ended.
type Proc struct {
	Proc    string      `json:"proc"`
	Sandbox string      `json:"sandbox"`
	Argv    []string    `json:"argv"`
	Started time.Time   `json:"started"`
	State   string      `json:"state"` // running | exited
	Exit    *ExitStatus `json:"exit,omitempty"`
	// Error says why it could not run or was cut off (the sandbox was released, say).
	Error string `json:"error,omitempty"`
}

// Proc states.
const (
	ProcRunning = "running"
	ProcExited  = "exited"
)

// ExecEvent is one JSON line of the exec response stream: output as it comes, then exactly
// one final event carrying Exit or Error.
type ExecEvent struct {
	Stdout []byte      `json:"o,omitempty"`
	Stderr []byte      `json:"e,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
	Error  *Error      `json:"error,omitempty"`
	// Detached is the final event of a detached exec (the only one).
	Detached *Proc `json:"detached,omitempty"`
}
