//go:build linux

package initd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/pool/initproto"
)

// An init that CRIU restored executes itself again before it listens. A process CRIU
// restores keeps the memory descriptor of the CRIU that made it, which belongs to the host's
// user namespace, and the init is not dumpable (Harden): from inside the sandbox's user
// namespace nothing may then open its /proc files, and CRIU's own check of a later dump
// (which enters the sandbox's user namespace and opens the init's namespaces) fails. A fresh
// execve gives the init a memory descriptor of the namespace it runs in; Harden makes it
// undumpable again. The init learns that it was restored from its start time, which CRIU
// cannot restore: it differs between the park before the dump and the unpark after the
// restore.
//
// What the new image needs is handed over in a memfd (ResumeFlag names its descriptor):
// the detached execs, their output windows and offsets, the still running ones' output
// pipes (inherited) and processes (children of the init across the execve, adopted by the
// reaper before it runs).

// ResumeFlag is the init's flag naming the descriptor of the handed-over state.
const ResumeFlag = "resume-fd"

// ResumeState is what an init hands to its next image.
type ResumeState struct {
	Detached []resumeDetached `json:"detached"`
}

type resumeDetached struct {
	Key      string                `json:"key"`
	Window   [2][]byte             `json:"window"`
	Produced [2]int64              `json:"produced"`
	Lost     [2]bool               `json:"lost"`
	Exit     *initproto.ExitStatus `json:"exit,omitempty"`
	Ended    time.Time             `json:"ended"`
	Running  *resumeProcess        `json:"running,omitempty"`
}

// resumeProcess is a detached exec's running command.
type resumeProcess struct {
	Pid      int       `json:"pid"`
	Argv     []string  `json:"argv"`
	Tag      string    `json:"tag"`
	Started  time.Time `json:"started"`
	Fds      [2]int    `json:"fds"` // its stdout and stderr pipes (-1: closed)
	Cap      int64     `json:"cap"`
	Deadline time.Time `json:"deadline"`
}

// startTime is this process's start time in clock ticks since boot (/proc/self/stat).
func startTime() (uint64, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/self/stat: %q", s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/self/stat: %d fields", len(f))
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 of the whole line
}

// reexec hands the state over and executes the init's binary again; it returns only if that
// failed (the init then goes on as it is).
func (s *Server) reexec() error {
	if unix.Gettid() != os.Getpid() {
		// cmd/deltabox-init keeps the serving goroutine on the first thread; an execve from
		// another one would move the pid between threads while the host looks at it.
		return fmt.Errorf("not on the init's first thread (tid %d)", unix.Gettid())
	}
	st := s.snapshotForResume()
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	fd, err := unix.MemfdCreate("deltabox-init-resume", 0) // inherited by the next image
	if err != nil {
		return fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "resume")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	// The pipes go to the next image; should the execve fail, they are closed on exec again
	// (or every later exec's command would inherit them).
	var kept []int
	defer func() {
		for _, pfd := range kept {
			unix.CloseOnExec(pfd)
		}
	}()
	for _, d := range st.Detached {
		if d.Running == nil {
			continue
		}
		for _, pfd := range d.Running.Fds {
			if pfd >= 0 {
				if _, err := unix.FcntlInt(uintptr(pfd), unix.F_SETFD, 0); err != nil {
					f.Close()
					return fmt.Errorf("keep fd %d: %w", pfd, err)
				}
				kept = append(kept, pfd)
			}
		}
	}
	argv := []string{os.Args[0]}
	for _, a := range os.Args[1:] {
		if !strings.HasPrefix(a, "--"+ResumeFlag) && !strings.HasPrefix(a, "-"+ResumeFlag) {
			argv = append(argv, a)
		}
	}
	argv = append(argv, fmt.Sprintf("--%s=%d", ResumeFlag, fd))
	s.log.Info("restored by CRIU: executing the init again", "detached", len(st.Detached))
	err = syscall.Exec(os.Args[0], argv, os.Environ())
	f.Close()
	return fmt.Errorf("execve %s: %w", os.Args[0], err)
}

// snapshotForResume collects the detached execs. A running one's pumps stop being read
// here: their descriptors go to the next image, which reads on from where they are.
func (s *Server) snapshotForResume() ResumeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st ResumeState
	for _, d := range s.detached {
		d.mu.Lock()
		rd := resumeDetached{Key: d.key, Window: d.window, Produced: d.produced, Lost: d.lost, Exit: d.exit, Ended: d.ended}
		if d.exit == nil && d.proc != nil {
			rp := &resumeProcess{Pid: d.proc.pid, Argv: d.proc.argv, Tag: d.proc.tag, Started: d.proc.started,
				Fds: [2]int{-1, -1}, Cap: d.cap, Deadline: d.deadline}
			for i, p := range d.pumps {
				if p != nil && !p.finished() {
					rp.Fds[i] = p.rawFd()
				}
			}
			rd.Running = rp
		}
		d.mu.Unlock()
		st.Detached = append(st.Detached, rd)
	}
	return st
}

// ReadResume reads the state an earlier image handed over on descriptor fd (and closes it).
func ReadResume(fd int) (*ResumeState, error) {
	f := os.NewFile(uintptr(fd), "resume")
	if f == nil {
		return nil, fmt.Errorf("resume: bad descriptor %d", fd)
	}
	defer f.Close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	var st ResumeState
	if err := json.NewDecoder(io.LimitReader(f, 64<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	return &st, nil
}

// WithResume makes the server take over what an earlier image of the init handed over.
func WithResume(st *ResumeState) Option { return func(s *Server) { s.resume = st } }

// adoptResumed registers the handed-over detached execs; the running ones' processes are
// adopted by the reaper (which must not run yet) and supervised again under ctx.
func (s *Server) adoptResumed(ctx context.Context) {
	if s.resume == nil {
		return
	}
	for _, rd := range s.resume.Detached {
		d := &detached{key: rd.Key, window: rd.Window, produced: rd.Produced, lost: rd.Lost, exit: rd.Exit, ended: rd.Ended,
			done: make(chan struct{})}
		if rd.Exit != nil || rd.Running == nil {
			if rd.Exit == nil { // ended without a status: nothing can give one any more
				d.exit = &initproto.ExitStatus{Code: -1, Error: "the init was restored while it ran and lost it"}
			}
			close(d.done)
			s.adoptDetached(d)
			continue
		}
		r := rd.Running
		p := &process{pid: r.Pid, argv: r.Argv, tag: r.Tag, started: r.Started, exit: s.reaper.adopt(r.Pid)}
		s.mu.Lock()
		s.execs[p.pid] = p
		s.mu.Unlock()
		d.proc, d.cap, d.deadline = p, r.Cap, r.Deadline
		for i, t := range []initproto.FrameType{initproto.FrameStdout, initproto.FrameStderr} {
			if r.Fds[i] < 0 {
				d.pumps[i] = finishedPump()
				continue
			}
			unix.CloseOnExec(r.Fds[i])
			left := int64(0)
			if r.Cap > 0 {
				left = max(r.Cap-rd.Produced[i], 1)
			}
			d.pumps[i] = startPump(os.NewFile(uintptr(r.Fds[i]), "detached output"), t, d, left)
		}
		s.adoptDetached(d)
		var timeout time.Duration
		if !r.Deadline.IsZero() {
			timeout = max(time.Until(r.Deadline), time.Millisecond)
		}
		go s.finishDetached(ctx, d, p, timeout)
	}
	s.log.Info("resumed after a restore", "detached", len(s.resume.Detached))
	s.resume = nil
}

func (s *Server) adoptDetached(d *detached) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.detached == nil {
		s.detached = map[string]*detached{}
	}
	s.detached[d.key] = d
}

// finished reports whether the pump reached the end of its pipe.
func (p *pump) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// rawFd is the descriptor the pump reads (-1 if it cannot be had).
func (p *pump) rawFd() int {
	fd := -1
	if raw, err := p.f.SyscallConn(); err == nil {
		_ = raw.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

// finishedPump is a pump with nothing left to read.
func finishedPump() *pump {
	p := &pump{done: make(chan struct{})}
	close(p.done)
	return p
}
