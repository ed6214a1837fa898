package orchestrator

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// A sandbox's checkpoints form a tree (docs/time-travel.md): each names its parent, the
// checkpoint the sandbox was at when it was taken. The head is the checkpoint the sandbox is
// at now (the latest checkpoint taken or the target of the latest rollback); the next
// checkpoint is its child. A rollback goes to any checkpoint of the tree and deletes none;
// retention (retain.go) bounds the tree.

// Reference forms besides IDs and names.
const (
	refHead  = "@"
	refLease = "lease"
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// validateName checks a checkpoint name: it must not read as an ID or another reference.
func validateName(name string) error {
	if name == "" {
		return nil
	}
	if !namePattern.MatchString(name) {
		return fmt.Errorf("checkpoint name %q: want letters, digits, '.', '_' or '-', at most 64: %w", name, errdefs.ErrInvalidArgument)
	}
	if _, err := strconv.Atoi(name); err == nil || name == refLease {
		return fmt.Errorf("checkpoint name %q reads as a checkpoint ID or reference: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// resolve returns the index in s.ckpts of the checkpoint ref names: an ID, a name, "@" (the
// head), "@~N" (N parents up from the head) or "lease" (the first checkpoint, the sandbox as
// leased). Unknown references are errdefs.ErrNotFound, a name several checkpoints carry
// errdefs.ErrInvalidArgument.
func (s *session) resolve(ref string) (int, error) {
	ref = strings.TrimSpace(ref)
	switch {
	case ref == "":
		return -1, fmt.Errorf("empty checkpoint reference: %w", errdefs.ErrInvalidArgument)
	case ref == refHead:
		return s.headIndex()
	case strings.HasPrefix(ref, refHead+"~"):
		n, err := strconv.Atoi(ref[2:])
		if err != nil || n < 0 {
			return -1, fmt.Errorf("checkpoint reference %q: want @~N with N >= 0: %w", ref, errdefs.ErrInvalidArgument)
		}
		i, err := s.headIndex()
		for ; err == nil && n > 0; n-- {
			if s.ckpts[i].Parent == "" || s.find(s.ckpts[i].Parent) < 0 {
				return -1, fmt.Errorf("checkpoint %q of sandbox %q: the tree is not that deep: %w", ref, s.id, errdefs.ErrNotFound)
			}
			i = s.find(s.ckpts[i].Parent)
		}
		return i, err
	case ref == refLease:
		if len(s.ckpts) == 0 {
			return -1, fmt.Errorf("sandbox %q has no checkpoints: %w", s.id, errdefs.ErrNotFound)
		}
		return 0, nil
	}
	if i := s.find(ref); i >= 0 {
		return i, nil
	}
	found := -1
	var ids []string
	for i, c := range s.ckpts {
		if c.Name == ref {
			found = i
			ids = append(ids, c.ID)
		}
	}
	switch {
	case len(ids) > 1:
		return -1, fmt.Errorf("checkpoint name %q of sandbox %q is ambiguous (checkpoints %s): use an ID: %w",
			ref, s.id, strings.Join(ids, ", "), errdefs.ErrInvalidArgument)
	case found < 0:
		return -1, fmt.Errorf("checkpoint %q of sandbox %q: %w", ref, s.id, errdefs.ErrNotFound)
	}
	return found, nil
}

// headIndex returns the index of the head.
func (s *session) headIndex() (int, error) {
	i := s.find(s.head)
	if i < 0 {
		return -1, fmt.Errorf("sandbox %q has no head checkpoint: %w", s.id, errdefs.ErrNotFound)
	}
	return i, nil
}

// ancestors returns id and its ancestors, id first.
func (s *session) ancestors(id string) []string {
	var out []string
	for id != "" {
		i := s.find(id)
		if i < 0 {
			break
		}
		out = append(out, id)
		id = s.ckpts[i].Parent
	}
	return out
}

// isAncestor reports whether a is b or an ancestor of b.
func (s *session) isAncestor(a, b string) bool {
	for _, id := range s.ancestors(b) {
		if id == a {
			return true
		}
	}
	return false
}

// pathBetween returns the checkpoints from a up to the common ancestor of a and b (a first,
// the ancestor excluded), the common ancestor, and the checkpoints from below it down to b.
func (s *session) pathBetween(a, b string) (up []string, lca string, down []string) {
	onA := map[string]bool{}
	for _, id := range s.ancestors(a) {
		onA[id] = true
	}
	for _, id := range s.ancestors(b) {
		if onA[id] {
			lca = id
			break
		}
		down = append([]string{id}, down...)
	}
	for _, id := range s.ancestors(a) {
		if id == lca {
			break
		}
		up = append(up, id)
	}
	return up, lca, down
}

// children returns the IDs of id's children.
func (s *session) children(id string) []string {
	var out []string
	for _, c := range s.ckpts {
		if c.Parent == id {
			out = append(out, c.ID)
		}
	}
	return out
}

// pinned reports whether checkpoint id is pinned.
func (s *session) pinned(id string) bool {
	for _, p := range s.meta.Pins {
		if p == id {
			return true
		}
	}
	return false
}

// behindCommit reports whether going to target would undo a commit: the commit point must be
// a strict ancestor of the target.
func (s *session) behindCommit(target string) bool {
	c := s.meta.CommitAfter
	return c != "" && (target == c || !s.isAncestor(c, target))
}

// committed reports whether checkpoint id is at or before the commit point (its effects, if
// it is on the commit point's path, were sent).
func (s *session) committed(id string) bool {
	c := s.meta.CommitAfter
	return c != "" && s.isAncestor(id, c)
}

// view is the API view of a checkpoint record.
func (s *session) view(c ckptRecord) api.Checkpoint { return s.viewMeasured(c, true) }

// viewMeasured is view; measure false leaves the templates' memory out (processViewMeasured).
func (s *session) viewMeasured(c ckptRecord, measure bool) api.Checkpoint {
	v := c.Checkpoint
	v.Committed = s.committed(c.ID)
	v.Pinned = s.pinned(c.ID)
	v.Head = c.ID == s.head
	v.Processes, v.TemplateBytes = s.processViewMeasured(c, measure)
	return v
}
