package criu

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	gocriu "github.com/checkpoint-restore/go-criu/v7"
)

// MinVersion is the oldest CRIU that works on the kernels DeltaBox targets (Debian 12's 3.17
// fails `criu check` on the vDSO of kernel 6.x), encoded as go-criu does: 4.1.0 = 40100.
const MinVersion = 40100

// Runner runs an external command and returns its combined output.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Status is what the daemon learned about CRIU at start.
type Status struct {
	Path        string
	Version     int // go-criu encoding: major*10000 + minor*100 + sublevel
	CheckPassed bool
	CheckOutput string
	Available   bool   // L3 checkpoints can be used
	Reason      string // why not, when !Available
}

// VersionString renders Version as "4.1.1".
func (s Status) VersionString() string {
	if s.Version == 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d.%d", s.Version/10000, s.Version/100%100, s.Version%100)
}

// Checker probes a CRIU binary.
type Checker struct {
	path    string
	runner  Runner
	version func(path string) (int, error)
}

// CheckerOpt configures a Checker.
type CheckerOpt func(*Checker)

// WithRunner replaces the command runner (for tests).
func WithRunner(r Runner) CheckerOpt { return func(c *Checker) { c.runner = r } }

// WithVersionFunc replaces the RPC version probe (for tests).
func WithVersionFunc(f func(path string) (int, error)) CheckerOpt {
	return func(c *Checker) { c.version = f }
}

// NewChecker returns a Checker for the CRIU binary at path (looked up on PATH if relative).
func NewChecker(path string, opts ...CheckerOpt) *Checker {
	c := &Checker{path: path, runner: ExecRunner{}, version: rpcVersion}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Check finds CRIU, asks its version over RPC and runs `criu check`. It never fails: a CRIU
// that is missing, too old or failing its check yields Available=false and a Reason.
func (c *Checker) Check(ctx context.Context) Status {
	st := Status{Path: c.path}
	if p, err := exec.LookPath(c.path); err == nil {
		st.Path = p
	} else {
		st.Reason = fmt.Sprintf("criu binary %q not found: %v", c.path, err)
		return st
	}
	v, err := c.version(st.Path)
	if err != nil {
		st.Reason = fmt.Sprintf("cannot get CRIU version from %s: %v", st.Path, err)
		return st
	}
	st.Version = v
	if v < MinVersion {
		st.Reason = fmt.Sprintf("CRIU %s at %s is too old: L3 needs CRIU >= 4.1", st.VersionString(), st.Path)
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := c.runner.Run(ctx, st.Path, "check")
	st.CheckOutput = strings.TrimSpace(string(out))
	if err != nil {
		st.Reason = fmt.Sprintf("`%s check` failed: %v: %s", st.Path, err, lastLine(st.CheckOutput))
		return st
	}
	st.CheckPassed, st.Available = true, true
	return st
}

func rpcVersion(path string) (int, error) {
	c := gocriu.MakeCriu()
	c.SetCriuPath(path)
	return c.GetCriuVersion()
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
