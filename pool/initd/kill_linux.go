//go:build linux

package initd

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"github.com/deltabox/deltabox/pool/initproto"
	"golang.org/x/sys/unix"
)

// killSelector picks the processes a kill targets: every process but the init (all), or
// the ones belonging to a tag.
type killSelector struct {
	all bool
	tag string
}

func (s *Server) handleKill(ctx context.Context, fw *initproto.FrameWriter, req *initproto.KillRequest) {
	if req == nil || (req.Tag == "") == !req.All || req.Timeout < 0 {
		replyError(fw, initproto.CodeInvalidArgument, fmt.Errorf("kill: want exactly one of tag or all"))
		return
	}
	sel := killSelector{all: req.All, tag: req.Tag}
	if req.Signal != "" && req.Signal != "SIGKILL" {
		sig, ok := softSignals[req.Signal]
		if !ok {
			replyError(fw, initproto.CodeInvalidArgument, fmt.Errorf("kill: signal %q: want SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2", req.Signal))
			return
		}
		s.signal(fw, sel, sig)
		return
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = s.killTimeout
	}
	killed, err := s.kill(ctx, sel, timeout)
	if err != nil {
		replyError(fw, initproto.CodeUnavailable, err)
		return
	}
	if req.All {
		s.forgetDetached()
	}
	_ = fw.Final(initproto.FrameResult, initproto.KillResponse{Killed: killed})
}

// softSignals are the signals a kill may send instead of SIGKILL.
var softSignals = map[string]unix.Signal{
	"SIGTERM": unix.SIGTERM, "SIGINT": unix.SIGINT, "SIGHUP": unix.SIGHUP, "SIGQUIT": unix.SIGQUIT,
	"SIGUSR1": unix.SIGUSR1, "SIGUSR2": unix.SIGUSR2,
}

// signal sends sig once to every process sel selects (a tag's process groups and their
// descendants) and answers at once: the processes decide what to do with it.
func (s *Server) signal(fw *initproto.FrameWriter, sel killSelector, sig unix.Signal) {
	targets, err := s.targets(sel)
	if err != nil {
		replyError(fw, initproto.CodeUnavailable, err)
		return
	}
	sent := []int{}
	for _, pid := range targets {
		if unix.Kill(pid, sig) == nil {
			sent = append(sent, pid)
		}
	}
	_ = fw.Final(initproto.FrameResult, initproto.KillResponse{Killed: sent})
}

// KillAll sends SIGKILL to every process of the sandbox but the init and waits until they
// are gone (used on SIGTERM). Outside PID 1 "the sandbox" is the init's descendants.
func (s *Server) KillAll(ctx context.Context, timeout time.Duration) ([]int, error) {
	return s.kill(ctx, killSelector{all: true}, timeout)
}

// kill rescans and kills until no selected process is alive: a process may fork between a
// scan and its kill. It returns every pid it signalled.
func (s *Server) kill(ctx context.Context, sel killSelector, timeout time.Duration) ([]int, error) {
	deadline := time.Now().Add(timeout)
	killed := map[int]bool{}
	delay := 200 * time.Microsecond
	for {
		targets, err := s.targets(sel)
		if err != nil {
			return nil, err
		}
		if len(targets) == 0 {
			return sortedKeys(killed), nil
		}
		for _, pid := range targets {
			_ = unix.Kill(pid, unix.SIGKILL)
			killed[pid] = true
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d processes still alive after %s: %v: %w", len(targets), timeout, targets, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kill: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 10*time.Millisecond)
	}
}

// targets returns the live processes sel selects.
func (s *Server) targets(sel killSelector) ([]int, error) {
	procs, err := scanProcs(s.procDir)
	if err != nil {
		return nil, err
	}
	parents := make(map[int]int, len(procs))
	for _, p := range procs {
		parents[p.pid] = p.ppid
	}
	self := map[int]bool{s.pid: true}
	groups := s.tagGroups(sel.tag)
	marker := initproto.TagEnv + "=" + sel.tag
	var out []int
	for _, p := range procs {
		if p.pid == s.pid || !p.live() {
			continue
		}
		if s.pid != 1 && !descendsFrom(p.pid, parents, self) {
			continue
		}
		if sel.all || groups[p.pgid] || descendsFrom(p.pid, parents, groups) || hasEnv(s.procDir, p.pid, marker) {
			out = append(out, p.pid)
		}
	}
	return out, nil
}

// tagGroups returns the process groups (= leader pids) of the running execs tagged tag.
func (s *Server) tagGroups(tag string) map[int]bool {
	groups := map[int]bool{}
	if tag == "" {
		return groups
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, p := range s.execs {
		if p.tag == tag {
			groups[pid] = true
		}
	}
	return groups
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
