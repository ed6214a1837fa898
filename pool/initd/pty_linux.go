//go:build linux

package initd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/deltabox/deltabox/pool/initproto"
	"golang.org/x/sys/unix"
)

// ptmxPath is the pseudo-terminal multiplexer. In a sandbox it is runc's symlink to
// pts/ptmx, the sandbox's own devpts instance (mounted with newinstance), so the terminal
// belongs to the sandbox and shows up as /dev/pts/N inside it.
var ptmxPath = "/dev/ptmx"

// handleExecTTY runs one OpExecTTY request to completion and writes its exit frame.
func (s *Server) handleExecTTY(ctx context.Context, sess session, req *initproto.ExecRequest) {
	fw := sess.fw
	if req == nil || req.TTY == nil {
		replyError(fw, initproto.CodeInvalidArgument, errors.New("exec-tty: no window size (exec.tty)"))
		return
	}
	sp, err := s.prepare(req)
	if err != nil {
		replyStartError(fw, err)
		return
	}
	sp.tty = true
	pt, err := openPTY(req.TTY.WithDefaults(), sp.cred)
	if err != nil {
		replyStartError(fw, notStarted(126, "open a terminal: %v", err))
		return
	}
	p, err := s.spawn(sp, req.Tag, pt)
	if err != nil {
		pt.close()
		replyStartError(fw, err)
		return
	}
	if req.ReportStart {
		_ = fw.WriteJSON(initproto.FrameStarted, initproto.Started{Pid: p.pid})
	}
	st := s.superviseTTY(ctx, sess, p, pt.stdout, req)
	_ = fw.Final(initproto.FrameExit, st)
}

// openPTY opens a new pseudo-terminal of size ws: the master (the init's end, non-blocking
// and close-on-exec) and the slave, given to uid:gid of cred when set, as the child's stdin,
// stdout and stderr. The slave is opened from the master (TIOCGPTPEER), not by its path.
func openPTY(ws initproto.WinSize, cred *syscall.Credential) (*pipes, error) {
	mfd, err := unix.Open(ptmxPath, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", ptmxPath, err)
	}
	master := os.NewFile(uintptr(mfd), ptmxPath)
	fail := func(what string, err error) (*pipes, error) {
		master.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock the terminal (TIOCSPTLCK)", err)
	}
	n, err := unix.IoctlGetUint32(mfd, unix.TIOCGPTN)
	if err != nil {
		return fail("terminal number (TIOCGPTN)", err)
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols}); err != nil {
		return fail("window size (TIOCSWINSZ)", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fail("open the terminal's slave (TIOCGPTPEER)", errno)
	}
	slave := os.NewFile(sfd, "/dev/pts/"+strconv.FormatUint(uint64(n), 10))
	if cred != nil {
		if err := unix.Fchown(int(sfd), int(cred.Uid), -1); err != nil {
			slave.Close()
			return fail("chown "+slave.Name(), err)
		}
	}
	return &pipes{stdin: master, stdout: master, childIn: slave, childOut: slave, childErr: slave}, nil
}

// superviseTTY streams the terminal's output, feeds it input and resizes, enforces the
// timeout and client cancellation, and returns the exit status once the command exited and
// the output drained. The master is closed at the end, which hangs up the terminal for
// background processes that still hold it.
func (s *Server) superviseTTY(ctx context.Context, sess session, p *process, master *os.File, req *initproto.ExecRequest) initproto.ExitStatus {
	out := startPump(master, initproto.FrameStdout, sess.fw, req.OutputCap)
	cancelled := make(chan struct{})
	go readTTYClient(sess, master, cancelled)
	ws, timedOut := waitExit(ctx, p, req.Timeout, cancelled)
	s.forget(p)
	s.drain(out)
	master.Close()
	st := statusOf(ws)
	st.TimedOut = timedOut
	st.Pid = p.pid
	st.Duration = time.Since(p.started)
	st.StdoutTruncated = out.truncated.Load()
	return st
}

// readTTYClient feeds input and resize frames to the terminal and closes cancelled when the
// client goes away or breaks the protocol, which kills the command.
func readTTYClient(sess session, master *os.File, cancelled chan<- struct{}) {
	defer close(cancelled)
	var buf []byte
	in := master
	for {
		t, payload, err := initproto.ReadFrame(sess.br, &buf)
		if err != nil {
			return
		}
		switch t {
		case initproto.FrameStdin:
			if in == nil {
				continue
			}
			if err := writeStdin(sess.conn, in, payload); errors.Is(err, errPeerGone) {
				return
			} else if err != nil {
				in = nil // the terminal is gone (the command ended): drop the rest
			}
		case initproto.FrameStdinEOF:
			if in != nil {
				typeEOF(sess, in)
			}
		case initproto.FrameResize:
			ws, err := initproto.DecodeResize(payload)
			if err != nil {
				return
			}
			resize(master, ws)
		default:
			return
		}
	}
}

// typeEOF types the terminal's EOF character (Ctrl-D) when it is in canonical mode: a
// program reading a line then sees the end of its input. In raw mode there is no EOF to
// give; the program gets nothing.
func typeEOF(sess session, master *os.File) {
	var eof byte
	_ = controlFd(master, func(fd int) {
		t, err := unix.IoctlGetTermios(fd, unix.TCGETS) // on a master: the slave's termios
		if err == nil && t.Lflag&unix.ICANON != 0 {
			eof = t.Cc[unix.VEOF]
		}
	})
	if eof != 0 {
		_ = writeStdin(sess.conn, master, []byte{eof})
	}
}

// resize sets the terminal's window size; the kernel sends SIGWINCH to its foreground
// process group. Zero dimensions are ignored; a closed terminal is fine.
func resize(master *os.File, ws initproto.WinSize) {
	if ws.Rows == 0 || ws.Cols == 0 {
		return
	}
	_ = controlFd(master, func(fd int) {
		_ = unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	})
}

// controlFd runs fn with f's descriptor, unless f is closed.
func controlFd(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}
