package initproto

import (
	"fmt"
	"syscall"
	"time"
)

// Version is the protocol version spoken by this package; it travels in Request.Version.
const Version = 1

// DefaultSocketPath is where the init listens inside the container.
const DefaultSocketPath = "/.deltabox/run/init.sock"

// UnparkSignal makes a parked init listen again. Parked (OpPark), the init closes its
// listening socket (removing the socket file) and keeps running, reaping and supervising the
// execs it already has; the host parks it around a CRIU dump: CRIU 4.1.1 cannot restore a
// path-bound unix socket in a process that also forks CRIU's session or group helpers
// (needed as soon as a daemonized process is reparented to the init), so a dumped init must
// not hold its listener. A restored init is still parked and must be unparked, and so must
// the dumped one. The signal is idempotent: a listening init, or one that predates parking,
// ignores it (Go's runtime drops signals a program did not ask for).
const UnparkSignal = syscall.SIGUSR2

// TagEnv is the environment variable the init sets in every exec that has a tag, so that
// kill-by-tag also finds descendants that left the exec's process group (setsid'd daemons).
const TagEnv = "DELTABOX_TAG"

// Size limits of the wire protocol. Both sides enforce them on what they read.
const (
	MaxRequestSize = 1 << 20 // request line, including the newline
	MaxDataFrame   = 1 << 20 // payload of stdin/stdout/stderr frames
	MaxJSONFrame   = 4 << 20 // payload of result/error/exit frames
)

// Op names a request kind.
type Op string

// The request kinds.
const (
	OpPing  Op = "ping"
	OpProcs Op = "procs"
	OpKill  Op = "kill"
	OpExec  Op = "exec"
	OpPark  Op = "park" // answer, then close the listener until UnparkSignal
	// OpExecTTY runs ExecRequest (with TTY set) on a new pseudo-terminal. It is an op of its
	// own, not a field of OpExec, so that an init that predates terminals (an L3 snapshot
	// restores the init binary it was dumped with) refuses it ("unknown op") instead of
	// running the command on pipes.
	OpExecTTY Op = "exec-tty"
	// OpAttach follows a detached exec (ExecRequest.Detach) again: its output from the
	// given offsets, then its exit frame.
	OpAttach Op = "attach"
)

// Request is the JSON line a client sends first on every connection.
type Request struct {
	Version int            `json:"v"`
	Op      Op             `json:"op"`
	Exec    *ExecRequest   `json:"exec,omitempty"`
	Kill    *KillRequest   `json:"kill,omitempty"`
	Attach  *AttachRequest `json:"attach,omitempty"`
}

// ExecRequest describes one command to run in the sandbox.
type ExecRequest struct {
	// Argv is the command; Argv[0] without a '/' is looked up in the merged env's PATH.
	Argv []string `json:"argv"`
	// Env holds KEY=VALUE entries merged over the init's own environment.
	Env []string `json:"env,omitempty"`
	// Workdir is the working directory (default: the init's, normally "/").
	Workdir string `json:"workdir,omitempty"`
	// User is "uid[:gid]" or "name[:group]", resolved through the sandbox's /etc files.
	User string `json:"user,omitempty"`
	// Stdin says the client streams stdin frames; otherwise stdin is /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// Timeout kills the whole process group after this long (0: none).
	Timeout time.Duration `json:"timeout_ns,omitempty"`
	// OutputCap is the number of bytes kept per stream (0: unlimited); the rest is dropped.
	OutputCap int64 `json:"output_cap,omitempty"`
	// Tag is an opaque label grouping processes (kill by tag, procs).
	Tag string `json:"tag,omitempty"`
	// TTY is the initial window size of the terminal of an OpExecTTY request (nil for OpExec;
	// zero rows or columns take 24x80).
	TTY *WinSize `json:"tty,omitempty"`
	// ReportStart asks for a FrameStarted (JSON: Started) once the command runs, before any
	// output: its pid in the sandbox.
	ReportStart bool `json:"report_start,omitempty"`
	// Detach, when set, is a key naming a detached exec: the command keeps running when the
	// client goes away (instead of being killed), its recent output is kept (DetachWindow
	// bytes per stream) and OpAttach with the same key follows it again, e.g. from a
	// restarted host daemon. The key must not name another detached exec the init still
	// holds. A detached exec takes no stdin.
	Detach string `json:"detach,omitempty"`
}

// WinSize is a terminal's window size in character cells.
type WinSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// WithDefaults returns ws with zero dimensions replaced by 24 rows and 80 columns.
func (ws WinSize) WithDefaults() WinSize {
	if ws.Rows == 0 {
		ws.Rows = 24
	}
	if ws.Cols == 0 {
		ws.Cols = 80
	}
	return ws
}

// resizeSize is the payload size of FrameResize.
const resizeSize = 4

// EncodeResize returns the payload of a FrameResize: rows and columns, big-endian uint16s.
func EncodeResize(ws WinSize) []byte {
	return []byte{byte(ws.Rows >> 8), byte(ws.Rows), byte(ws.Cols >> 8), byte(ws.Cols)}
}

// DecodeResize reads a FrameResize payload.
func DecodeResize(p []byte) (WinSize, error) {
	if len(p) != resizeSize {
		return WinSize{}, fmt.Errorf("resize frame of %d bytes, want %d: %w", len(p), resizeSize, ErrProtocol)
	}
	return WinSize{Rows: uint16(p[0])<<8 | uint16(p[1]), Cols: uint16(p[2])<<8 | uint16(p[3])}, nil
}

// DetachWindow is how much of each stream of a detached exec the init keeps for OpAttach:
// output written while no client follows it, beyond this much, is lost (the exit status says
// it was truncated).
const DetachWindow = 256 << 10

// MaxDetached bounds the detached execs an init holds, exited ones included (it forgets the
// oldest exited ones first; a kill of all processes forgets them all).
const MaxDetached = 64

// Started is the payload of FrameStarted.
type Started struct {
	Pid int `json:"pid"`
}

// AttachRequest selects the detached exec OpAttach follows and where its output resumes:
// From holds the stdout and stderr bytes the client already has.
type AttachRequest struct {
	Key  string   `json:"key"`
	From [2]int64 `json:"from"`
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
	// Duration is the wall time from start to exit, as seen by the init.
	Duration time.Duration `json:"duration_ns,omitempty"`
}

// Started reports whether the command was started at all.
func (s ExitStatus) Started() bool { return s.Error == "" }

// PingResponse answers OpPing.
type PingResponse struct {
	Protocol  int           `json:"protocol"`
	Version   string        `json:"version"`
	Pid       int           `json:"pid"`
	Started   time.Time     `json:"started"`
	Uptime    time.Duration `json:"uptime_ns"`
	Subreaper bool          `json:"subreaper,omitempty"`
}

// ProcInfo describes one running exec started by the init.
type ProcInfo struct {
	Pid     int       `json:"pid"`
	Pgid    int       `json:"pgid"`
	Tag     string    `json:"tag,omitempty"`
	Argv    []string  `json:"argv"`
	Started time.Time `json:"started"`
}

// ProcsResponse answers OpProcs.
type ProcsResponse struct {
	Procs []ProcInfo `json:"procs"`
}

// KillRequest selects what OpKill kills with SIGKILL (or signals with Signal): exactly one of
// Tag or All.
type KillRequest struct {
	// Tag kills the execs with this tag, their process groups and every process carrying
	// TagEnv=Tag or descending from them.
	Tag string `json:"tag,omitempty"`
	// All kills every process of the sandbox except the init itself.
	All bool `json:"all,omitempty"`
	// Timeout bounds the wait until the processes are gone (0: the server's default).
	Timeout time.Duration `json:"timeout_ns,omitempty"`
	// Signal, when set and not "SIGKILL", is sent once (SIGTERM, SIGINT, SIGHUP, SIGQUIT,
	// SIGUSR1, SIGUSR2) to every selected process, without waiting for them to exit: a
	// command that traps it can clean up.
	Signal string `json:"signal,omitempty"`
}

// KillResponse answers OpKill.
type KillResponse struct {
	// Killed lists the pids that were sent SIGKILL (or Signal).
	Killed []int `json:"killed"`
}

// Error codes carried by ErrorResponse.Code (the same words as the DeltaBox API).
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeFailedPrecondition = "failed_precondition"
	CodeUnavailable        = "unavailable"
	CodeInternal           = "internal"
	CodeNotFound           = "not_found"
)

// ErrorResponse is the payload of FrameError.
type ErrorResponse struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
