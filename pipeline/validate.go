package pipeline

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

var stepNameRE = lazyRE(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// validate checks the whole pipeline, naming the line of the first problem.
func (p *Pipeline) validate(doc *yaml.Node) error {
	if p.Pool == "" {
		return lineErrorf(doc.Line, "the pipeline names no pool (pool: NAME)")
	}
	if len(p.Steps) == 0 {
		return lineErrorf(doc.Line, "the pipeline has no steps")
	}
	if err := checkCommit(p.Commit, doc.Line); err != nil {
		return err
	}
	if err := p.loadFiles(keyLine(doc, "files")); err != nil {
		return err
	}
	if err := p.parseFailover(keyLine(doc, "failover")); err != nil {
		return err
	}
	byName := map[string]*Step{}
	all := append(append([]*Step{}, p.Steps...), p.Fallbacks...)
	for i, s := range all {
		if s == nil {
			return lineErrorf(doc.Line, "step %d is empty", i+1)
		}
		s.pipe, s.index = p, i
		if s.Name == "" {
			s.Name = fmt.Sprintf("step%d", i+1)
		}
		if byName[s.Name] != nil {
			return lineErrorf(s.Line, "step name %q is used twice (also at line %d)", s.Name, byName[s.Name].Line)
		}
		byName[s.Name] = s
		if err := s.validate(p); err != nil {
			return err
		}
	}
	return linkFallbacks(all, byName)
}

func checkCommit(c string, line int) error {
	switch c {
	case "", CommitStep, CommitTask:
		return nil
	}
	return lineErrorf(line, "commit %q: want step or task", c)
}

// validate checks one step and compiles its templates.
func (s *Step) validate(p *Pipeline) error {
	if !stepNameRE().MatchString(s.Name) {
		return lineErrorf(s.Line, "step name %q: want letters, digits, '.', '_' or '-' (at most 64)", s.Name)
	}
	switch {
	case len(s.Run) == 0 && s.Script == "":
		return lineErrorf(s.Line, "step %q has no command: give run (an argv list) or script", s.Name)
	case len(s.Run) > 0 && s.Script != "":
		return lineErrorf(s.Line, "step %q has both run and script: give one", s.Name)
	}
	switch s.Checkpoint {
	case "":
		s.Checkpoint = LevelL1
	case LevelL1, LevelL2:
	default:
		return lineErrorf(s.Line, "step %q: checkpoint %q: want l1 or l2", s.Name, s.Checkpoint)
	}
	switch s.Failover {
	case "", FailoverNone, FailoverL3:
	default:
		return lineErrorf(s.Line, "step %q: failover %q: want l3 or none", s.Name, s.Failover)
	}
	if err := s.defaults(p); err != nil {
		return err
	}
	if err := s.compileTemplates(p.Env); err != nil {
		return lineErrorf(s.Line, "step %q: %v", s.Name, err)
	}
	return nil
}

// defaults fills in the pipeline-wide defaults and checks the numbers.
func (s *Step) defaults(p *Pipeline) error {
	if err := checkCommit(s.Commit, s.Line); err != nil {
		return err
	}
	if s.Commit == "" {
		s.Commit = p.Commit
	}
	if s.Commit == "" {
		s.Commit = CommitTask
	}
	if s.Workdir == "" {
		s.Workdir = p.Workdir
	}
	if s.Timeout == 0 {
		s.Timeout = p.Timeout
	}
	if s.Retry.Attempts == 0 {
		s.Retry.Attempts = 1
	}
	if s.Retry.Attempts < 0 || s.Retry.Attempts > 100 || s.Retry.Backoff < 0 || s.Timeout < 0 {
		return lineErrorf(s.Line, "step %q: retry.attempts must be 1..100, backoff and timeout not negative", s.Name)
	}
	if s.OnFailure.Action == "" {
		s.OnFailure.Action = OnFailureStop
	}
	return nil
}

// linkFallbacks resolves every {fallback: NAME}; a fallback must not fall back itself.
func linkFallbacks(all []*Step, byName map[string]*Step) error {
	for _, s := range all {
		if s.OnFailure.Action != OnFailureFallback {
			continue
		}
		fb := byName[s.OnFailure.Fallback]
		switch {
		case fb == nil:
			return lineErrorf(s.OnFailure.line, "step %q falls back to %q, which is no step", s.Name, s.OnFailure.Fallback)
		case fb == s:
			return lineErrorf(s.OnFailure.line, "step %q falls back to itself", s.Name)
		case fb.OnFailure.Action == OnFailureFallback:
			return lineErrorf(s.OnFailure.line, "step %q falls back to %q, which has a fallback itself (chains are not allowed)", s.Name, fb.Name)
		}
		s.fb = fb
	}
	return nil
}

// keyLine is the line of a top-level key (the document's line when it is absent).
func keyLine(doc *yaml.Node, key string) int {
	if v := mapValue(doc, key); v != nil {
		return v.Line
	}
	return doc.Line
}

// Failover values.
const (
	FailoverL3   = "l3"   // a step: an L3 failover point after it
	FailoverNone = "none" // no failover point (a step: not even the pipeline's every-N one)
)

var failoverRE = lazyRE(`^l3 every (?:step|([1-9][0-9]{0,3}) steps?)$`)

// parseFailover reads the pipeline's `failover: l3 every N steps`.
func (p *Pipeline) parseFailover(line int) error {
	if p.Failover == "" || p.Failover == FailoverNone {
		return nil
	}
	m := failoverRE().FindStringSubmatch(p.Failover)
	if m == nil {
		return lineErrorf(line, "failover %q: want \"l3 every N steps\", \"l3 every step\" or none", p.Failover)
	}
	p.failoverEvery = 1
	if m[1] != "" {
		p.failoverEvery, _ = strconv.Atoi(m[1])
	}
	return nil
}

// FailoverAfter reports whether the Temporal engine pushes an L3 failover point after the
// pipeline's step i (from 0): the step asks for one, or it ends a run of the pipeline's
// every-N steps (and does not say none). The last step never needs one.
func (p *Pipeline) FailoverAfter(i int) bool {
	if i < 0 || i >= len(p.Steps)-1 {
		return false
	}
	switch p.Steps[i].Failover {
	case FailoverL3:
		return true
	case FailoverNone:
		return false
	}
	return p.failoverEvery > 0 && (i+1)%p.failoverEvery == 0
}

// HasFailover reports whether the pipeline asks for L3 failover points at all.
func (p *Pipeline) HasFailover() bool {
	if p.failoverEvery > 0 {
		return true
	}
	for _, s := range p.Steps {
		if s.Failover == FailoverL3 {
			return true
		}
	}
	return false
}
