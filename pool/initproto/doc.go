// Package initproto owns the wire protocol between the DeltaBox host and the sandbox init
// (PID 1 of every sandbox, cmd/deltabox-init) and the host-side client of it. It must not
// start processes or know about containerd; the server side lives in pool/initd.
//
// # Transport
//
// The init listens on a unix stream socket inside the sandbox's run directory
// (/.deltabox/run/init.sock in the container, a per-sandbox directory on the host). Every
// request uses its own connection: the client connects, sends one request, reads the answer
// and closes. Closing the connection early cancels the request (for exec: the process group
// is killed with SIGKILL).
//
// # Request
//
// The client sends one JSON object ([Request]) terminated by '\n', at most [MaxRequestSize]
// bytes. Its "v" field carries [Version]; a server that speaks another version answers with
// an error frame (code "failed_precondition"). Ops: "ping", "procs", "kill", "exec",
// "exec-tty", "park", "attach".
//
// # Frames
//
// Everything after the request line is a sequence of frames:
//
//	[1 byte type][4 byte big-endian payload length][payload]
//
// Client to server (exec only, when ExecRequest.Stdin is true): [FrameStdin] carries raw
// bytes for the command's stdin, [FrameStdinEOF] (empty) closes it. Nothing else is sent;
// the client keeps the connection open until it has read the exit frame.
//
// Server to client:
//   - ping, procs, kill: exactly one [FrameResult] (JSON: [PingResponse], [ProcsResponse],
//     [KillResponse]) or one [FrameError] (JSON: [ErrorResponse]), then the server closes.
//   - exec: any number of [FrameStdout] and [FrameStderr] frames (raw bytes, in the order
//     the command wrote them per stream), then exactly one [FrameExit] (JSON: [ExitStatus]).
//     A malformed request gets a [FrameError] instead. A command that cannot be started
//     (missing binary, bad workdir, unknown user) still gets a [FrameExit] with Error set and
//     Code 127 (not found) or 126 (any other start failure), like a shell. With
//     ExecRequest.ReportStart a [FrameStarted] (JSON: [Started], the pid) comes first.
//   - exec with ExecRequest.Detach: as exec, but closing the connection does not kill the
//     command; "attach" (AttachRequest: the key, and the stdout and stderr bytes the client
//     has) answers with the output from there that the init still holds (the last
//     [DetachWindow] bytes per stream), then follows the command like exec, to its
//     [FrameExit]. An unknown key gets a [FrameError] with code "not_found".
//   - kill with KillRequest.Signal (SIGTERM and the like): the signal is sent once to the
//     selected processes and the answer comes at once; a trapping command can clean up.
//
// exec-tty ([OpExecTTY], ExecRequest.TTY set) runs the command on a new pseudo-terminal of
// the sandbox's own devpts instance: the init opens /dev/ptmx, unlocks it, opens the
// terminal's other end and starts the command as the leader of a new session with that
// terminal as its controlling terminal and stdin, stdout and stderr. The client may send
// [FrameStdin] (bytes typed on the terminal: a 0x03 reaches the foreground process group as
// SIGINT through the line discipline), [FrameResize] (4 bytes: rows and columns as
// big-endian uint16s; the foreground process group gets SIGWINCH) and [FrameStdinEOF] (the
// terminal's EOF character, Ctrl-D, is typed when the terminal is in canonical mode). The
// server answers with [FrameStdout] frames (everything the terminal shows: stdout and stderr
// are one stream) and the [FrameExit], with ExecRequest.ReportStart a [FrameStarted] first
// (an init that predates it on exec-tty sends none). An init that predates exec-tty answers with an error
// frame ("unknown op"), never with a command run on pipes.
//
// Data frames are at most [MaxDataFrame] bytes, JSON frames at most [MaxJSONFrame] bytes,
// resize frames exactly 4 bytes.
//
// # Trust
//
// The socket directory is writable by the sandbox, so the client treats everything on the
// sandbox side as hostile: it never follows a symlink when connecting (the socket is
// opened with O_PATH|O_NOFOLLOW, checked to be a socket, and connected through
// /proc/self/fd/N), and it bounds every read (frame and JSON sizes, output caps).
package initproto
