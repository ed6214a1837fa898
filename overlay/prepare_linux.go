//go:build linux

package overlay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// PreparedRollback is a rollback worked out while the sandbox may still run (PrepareRollback):
// the upper dir scanned and the plan made, every content it needs read or opened and checked,
// so that the frozen window only checks that nothing moved since and writes. Until Rollback
// or Abort, the store is held: its other operations wait.
type PreparedRollback struct {
	s     *Store
	req   RollbackRequest
	fds   rollbackRoots
	w     *worked
	ph    rollbackPhases
	start time.Time
}

// PrepareRollback works out the rollback req asks for (its BeforeWrite is not used: Rollback
// takes one) without writing anything, while the sandbox may still run. The caller then
// freezes the sandbox and calls Rollback, which applies the plan if the sandbox changed
// nothing it depends on meanwhile, and works the rollback out again in the window if it did.
// A failure here has changed nothing and holds nothing: the caller rolls back as usual.
func (s *Store) PrepareRollback(ctx context.Context, req RollbackRequest) (*PreparedRollback, error) {
	p := &PreparedRollback{s: s, req: req, start: time.Now()}
	s.mu.Lock()
	fds, err := openRollbackRoots(req)
	if err == nil {
		p.fds = fds
		p.w, err = s.workOut(ctx, req, fds, &p.ph)
		if err != nil {
			fds.close()
		}
	}
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("prepare rollback to %s: %w", req.Target, err)
	}
	return p, nil
}

// Rollback applies the prepared rollback and releases the store (Store.Rollback, in the
// caller's frozen window). open are the sandbox's open files now. The plan is applied as it
// was prepared when it still holds (current): the change tracker saw nothing in the upper dir
// since its scan, and the open files are the same, the writable ones with the same stat.
// Else the rollback is worked out again first, from a new scan. beforeWrite is as
// RollbackRequest.BeforeWrite.
func (p *PreparedRollback) Rollback(ctx context.Context, open OpenFiles, beforeWrite func() error) (*RollbackResult, error) {
	s := p.s
	if s == nil {
		return nil, fmt.Errorf("rollback to %s: already applied or aborted: %w", p.req.Target, errdefs.ErrFailedPrecondition)
	}
	p.s = nil
	start := time.Now()
	defer s.mu.Unlock()
	defer s.prepareTemp()
	defer p.fds.close()
	defer func() { p.w.close() }()
	ph := p.ph
	why := p.stale(s, open)
	checked := why == ""
	if !checked {
		p.w.close()
		p.req.Open = open
		ph = rollbackPhases{}
		w, err := s.workOut(ctx, p.req, p.fds, &ph)
		if err != nil {
			p.w = &worked{}
			return nil, fmt.Errorf("rollback to %s: %w", p.req.Target, err)
		}
		p.w = w
	}
	inWindow := time.Now()
	res, err := s.applyWorked(p.w, p.req.Meta, p.req.Deferred, beforeWrite, &ph)
	if err != nil {
		return nil, fmt.Errorf("rollback to %s: %w", p.req.Target, err)
	}
	end := time.Now()
	res.Prepared = checked
	res.Phases = RollbackPhases{Total: end.Sub(start), Index: end.Sub(ph.written), Prepared: checked,
		BeforeWrite: ph.writing.Sub(ph.planned), Write: ph.written.Sub(ph.writing), Replanned: why}
	if checked { // scanned and planned before: the window only checked
		res.Phases.Scan, res.Phases.Plan, res.Phases.Check = ph.scanned.Sub(p.start), ph.planned.Sub(ph.scanned), inWindow.Sub(start)
		res.Phases.BeforeWrite = ph.writing.Sub(inWindow)
	} else {
		res.Phases.Check, res.Phases.Scan, res.Phases.Plan = inWindow.Sub(start), ph.scanned.Sub(start), ph.planned.Sub(ph.scanned)
	}
	return res, nil
}

// Abort drops the prepared rollback and releases the store. It is a no-op after Rollback.
func (p *PreparedRollback) Abort() {
	s := p.s
	if s == nil {
		return
	}
	p.s = nil
	p.w.close()
	p.fds.close()
	s.mu.Unlock()
}

// stale says why the prepared plan no longer holds ("" when it does): it holds when the
// change tracker vouched for the scan and has seen no change in the upper dir since (the
// caller has frozen the sandbox, so every write it made is reported by now), files mapped
// shared and writable now were planned as changed (mapped when prepared: a write through a
// mapping raises no event), and every file held open for writing or mapped now is as the
// scan saw it (sawOpen: a write through a mapping made and removed since raises no event
// either, but moves the file's mtime).
func (p *PreparedRollback) stale(s *Store, open OpenFiles) string {
	trk := p.w.res.trk
	if trk == nil {
		return "the scan was not tracked"
	}
	var changed map[uint64]bool
	known := func(ino uint64) bool {
		if len(s.idx.byIno[ino]) > 0 {
			return true
		}
		if changed == nil {
			changed = make(map[uint64]bool, len(p.w.res.changed))
			for _, c := range p.w.res.changed {
				changed[c.st.Ino] = true
			}
		}
		return changed[ino]
	}
	if why := trk.quietSince(p.w.res.tok, known); why != "" {
		return why
	}
	for _, m := range open.Mapped {
		if !slices.Contains(p.req.Open.Mapped, m) {
			return m + " is mapped shared now, not when prepared"
		}
	}
	if f := p.sawOpen(s, open.all()); f != "" {
		return f + " open now is not as the scan saw it"
	}
	return ""
}

// sawOpen returns the first of files (paths as the sandbox sees them) the prepared scan did
// not see as the upper dir holds it now ("" when it saw them all): absent then and now, or
// with the same stat, as the scan found it changed or, when it did not list it, as the
// index has it.
func (p *PreparedRollback) sawOpen(s *Store, files []string) string {
	if len(files) == 0 {
		return ""
	}
	seen := map[string]*Key{}
	for _, c := range p.w.res.changed {
		k := keyOf(&c.st)
		seen[c.entry.Path] = &k
	}
	for _, g := range p.w.res.gone {
		seen[g] = nil
	}
	for _, f := range files {
		rel, err := cleanRel(strings.TrimPrefix(f, "/"))
		if err != nil {
			continue // not a path of the tree (the scan leaves it out too)
		}
		want, listed := seen[rel]
		if ie := s.idx.keys[rel]; !listed && ie != nil {
			want = &ie.key
		}
		have, err := upperKey(p.fds.upper, rel)
		if err != nil || (have == nil) != (want == nil) || (have != nil && *have != *want) {
			return f
		}
	}
	return ""
}

// upperKey returns the stat key of rel in the upper dir (nil when it is not there).
func upperKey(upperfd int, rel string) (*Key, error) {
	pfd, name, err := openParent(upperfd, rel)
	if isNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if isNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	k := keyOf(&st)
	return &k, nil
}
