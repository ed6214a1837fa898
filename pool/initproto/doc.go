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
// an error frame (code "failed_precondition"). Ops: "ping", "procs", "kill", "exec".
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
//     Code 127 (not found) or 126 (any other start failure), like a shell.
//
// Data frames are at most [MaxDataFrame] bytes, JSON frames at most [MaxJSONFrame] bytes.
//
// # Trust
//
// The socket directory is writable by the sandbox, so the client treats everything on the
// sandbox side as hostile: it never follows a symlink when connecting (the socket is
// opened with O_PATH|O_NOFOLLOW, checked to be a socket, and connected through
// /proc/self/fd/N), and it bounds every read (frame and JSON sizes, output caps).
package initproto
