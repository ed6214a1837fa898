//go:build linux

package initd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/deltabox/deltabox/pool/initproto"
	"golang.org/x/sys/unix"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// startError is an exec that could not start; it becomes an exit frame, not an error frame.
type startError struct {
	code int // 127 not found, 126 otherwise
	err  error
}

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

func notStarted(code int, format string, args ...any) error {
	return &startError{code: code, err: fmt.Errorf(format, args...)}
}

// spec is a validated exec request ready to fork.
type spec struct {
	path string
	argv []string
	env  []string
	dir  string
	cred *syscall.Credential
	tty  bool // stdin is a terminal: a new session with it as the controlling terminal
}

// prepare validates req and resolves its user, environment, binary and workdir.
func (s *Server) prepare(req *initproto.ExecRequest) (spec, error) {
	if req == nil || len(req.Argv) == 0 || req.Argv[0] == "" {
		return spec{}, fmt.Errorf("exec: empty argv: %w", errdefs.ErrInvalidArgument)
	}
	if req.Timeout < 0 || req.OutputCap < 0 {
		return spec{}, fmt.Errorf("exec: negative timeout or output cap: %w", errdefs.ErrInvalidArgument)
	}
	sp := spec{argv: req.Argv, dir: req.Workdir}
	home := ""
	if req.User != "" {
		id, err := lookupIdentity(s.etcDir, req.User)
		if err != nil {
			return spec{}, notStarted(126, "resolve user: %v", err)
		}
		sp.cred = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
		home = id.home
	}
	env, err := mergeEnv(s.baseEnv, req.Env, home, req.Tag)
	if err != nil {
		return spec{}, err
	}
	sp.env = env
	if err := checkDir(sp.dir); err != nil {
		return spec{}, err
	}
	if sp.path, err = lookPath(req.Argv[0], envValue(env, "PATH"), sp.dir); err != nil {
		return spec{}, err
	}
	return sp, nil
}

// mergeEnv overlays extra on base by key; home (when set and extra has no HOME) and the tag
// marker are added last.
func mergeEnv(base, extra []string, home, tag string) ([]string, error) {
	idx := make(map[string]int, len(base)+len(extra))
	out := make([]string, 0, len(base)+len(extra)+2)
	set := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			return
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		set(kv)
	}
	userHome := false
	for _, kv := range extra {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("exec: env entry %q is not KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
		userHome = userHome || strings.HasPrefix(kv, "HOME=")
		set(kv)
	}
	if home != "" && !userHome {
		set("HOME=" + home)
	}
	if tag != "" {
		set(initproto.TagEnv + "=" + tag)
	}
	return out, nil
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return notStarted(126, "workdir %s: %v", dir, err)
	}
	if !fi.IsDir() {
		return notStarted(126, "workdir %s: not a directory", dir)
	}
	return nil
}

// lookPath finds name like a shell: names with a '/' are used as they are (relative to
// dir), others are searched in pathEnv.
func lookPath(name, pathEnv, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		return p, checkExecutable(p)
	}
	if pathEnv == "" {
		pathEnv = defaultPath
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", notStarted(127, "exec: %q: executable file not found in $PATH", name)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return notStarted(127, "exec: %q: no such file or directory", p)
	case err != nil:
		return notStarted(126, "exec: %q: %v", p, err)
	case fi.IsDir():
		return notStarted(126, "exec: %q: is a directory", p)
	case fi.Mode()&0o111 == 0:
		return notStarted(126, "exec: %q: permission denied", p)
	}
	return nil
}

// process is one running exec.
type process struct {
	pid     int
	argv    []string
	tag     string
	started time.Time
	exit    <-chan unix.WaitStatus
}

func (p *process) info() initproto.ProcInfo {
	return initproto.ProcInfo{Pid: p.pid, Pgid: p.pid, Tag: p.tag, Argv: p.argv, Started: p.started}
}

// pipes are the parent's ends of a child's stdio (stdin nil when it is /dev/null) and the
// child's ends, which the parent closes right after the fork.
type pipes struct {
	stdin, stdout, stderr       *os.File
	childIn, childOut, childErr *os.File
	devNull                     *os.File
}

func (s *Server) newPipes(withStdin bool) (*pipes, error) {
	p := &pipes{childIn: s.devNull, devNull: s.devNull}
	var err error
	if withStdin {
		if p.childIn, p.stdin, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
	}
	if p.stdout, p.childOut, err = os.Pipe(); err != nil {
		p.close()
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if p.stderr, p.childErr, err = os.Pipe(); err != nil {
		p.close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	return p, nil
}

// fds returns the child's stdin, stdout and stderr descriptors.
func (p *pipes) fds() []uintptr {
	return []uintptr{p.childIn.Fd(), p.childOut.Fd(), p.childErr.Fd()}
}

// closeChild closes the child's ends in the parent (never the shared /dev/null).
func (p *pipes) closeChild() {
	for _, f := range []*os.File{p.childIn, p.childOut, p.childErr} {
		if f != nil && f != p.devNull {
			f.Close()
		}
	}
}

// close closes every end that is still open.
func (p *pipes) close() {
	p.closeChild()
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// spawn forks sp in its own process group (a terminal exec: its own session, whose process
// group has the same id) through the reaper and registers it.
func (s *Server) spawn(sp spec, tag string, io *pipes) (*process, error) {
	attr := &syscall.ProcAttr{
		Dir:   sp.dir,
		Env:   sp.env,
		Files: io.fds(),
		Sys:   &syscall.SysProcAttr{Setpgid: !sp.tty, Setsid: sp.tty, Setctty: sp.tty, Credential: sp.cred},
	}
	pid, ch, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(sp.path, sp.argv, attr)
	})
	io.closeChild()
	if err != nil {
		code := 126
		if errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		return nil, notStarted(code, "exec: %q: %v", sp.path, err)
	}
	p := &process{pid: pid, argv: sp.argv, tag: tag, started: time.Now(), exit: ch}
	s.mu.Lock()
	s.execs[pid] = p
	s.mu.Unlock()
	return p, nil
}

func (s *Server) forget(p *process) {
	s.mu.Lock()
	delete(s.execs, p.pid)
	s.mu.Unlock()
}
