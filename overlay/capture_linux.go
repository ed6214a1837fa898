//go:build linux

package overlay

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// Capture records a checkpoint of the upper dir. L1 stores what changed since req.Parent
// (which must be the latest checkpoint); L2, and the first checkpoint of a store, store the
// whole upper dir. The upper dir is only read; the caller keeps the sandbox frozen. The
// checkpoint is durable when Capture returns. It is Prepare and Commit in one.
func (s *Store) Capture(ctx context.Context, req CaptureRequest) (*CaptureResult, error) {
	p, err := s.Prepare(ctx, req)
	if err != nil {
		return nil, err
	}
	return p.Commit(req.Meta)
}

// PendingCapture is a checkpoint whose contents are copied but which is not durable yet. Until
// Commit or Abort, the store is held: its other operations wait.
type PendingCapture struct {
	s       *Store
	req     CaptureRequest
	m       *manifest
	pw      *packWriter
	res     *scanResult
	copied  int64
	rootKey Key
	start   time.Time
	scanned time.Time
	copyEnd time.Time
}

// Prepare runs the part of a capture that needs the sandbox frozen: it finds what changed
// and copies the contents into a new pack (clones share extents; plain copies land in the
// page cache). Commit makes the pack durable, with the caller's record, after the sandbox
// runs again: the frozen window does not wait for the disk.
func (s *Store) Prepare(ctx context.Context, req CaptureRequest) (*PendingCapture, error) {
	p := &PendingCapture{s: s, req: req, start: time.Now()}
	s.mu.Lock()
	ok := false
	defer func() {
		if !ok {
			s.prepareTemp()
			s.mu.Unlock()
		}
	}()
	if err := s.checkCapture(req); err != nil {
		return nil, fmt.Errorf("capture %s: %w", req.ID, err)
	}
	rootfd, err := openRoot(req.Upper)
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", req.ID, err)
	}
	defer unix.Close(rootfd)
	full := req.Level == L2 || len(s.chain) == 0
	if p.res, err = s.scan(ctx, rootfd, req.Upper, full, req.Open); err != nil {
		return nil, fmt.Errorf("capture %s: scan upper dir: %w", req.ID, err)
	}
	p.scanned = time.Now()
	if p.m, p.pw, p.copied, err = s.copyCheckpoint(rootfd, req, full, p.res); err != nil {
		return nil, fmt.Errorf("capture %s: %w", req.ID, err)
	}
	if p.m.Root, p.rootKey, err = s.captureRoot(rootfd, full); err != nil {
		p.pw.abort()
		return nil, fmt.Errorf("capture %s: %w", req.ID, err)
	}
	p.copyEnd = time.Now()
	ok = true
	return p, nil
}

// Commit writes the manifest (holding meta, an opaque record the caller reads back with
// Meta) and makes the checkpoint durable, then releases the store.
func (p *PendingCapture) Commit(meta []byte) (*CaptureResult, error) {
	s, m := p.s, p.m
	if s == nil {
		return nil, fmt.Errorf("capture %s: already committed or aborted: %w", p.req.ID, errdefs.ErrFailedPrecondition)
	}
	p.s = nil
	defer s.mu.Unlock()
	defer s.prepareTemp()
	if meta != nil && !json.Valid(meta) {
		p.pw.abort()
		return nil, fmt.Errorf("capture %s: the checkpoint record is not JSON: %w", m.ID, errdefs.ErrInvalidArgument)
	}
	m.Meta = meta
	if err := s.persistRollback(); err != nil { // the manifest names its nonce: on disk first
		p.pw.abort()
		return nil, fmt.Errorf("capture %s: %w", m.ID, err)
	}
	if err := p.pw.commit(m, filepath.Join(s.dir, m.ID+packSuffix)); err != nil {
		p.pw.abort()
		return nil, fmt.Errorf("capture %s: %w", m.ID, err)
	}
	s.commitCapture(m, p.pw.file(), p.res)
	if m.Root != nil {
		s.root = m.Root
	}
	s.rootKey = p.rootKey // the root as recorded, whether it moved or not
	out := &CaptureResult{ID: m.ID, Level: m.Level, FilesChanged: len(m.Entries), BytesCopied: p.copied, Duration: time.Since(p.start)}
	for _, e := range m.Entries {
		out.Paths = append(out.Paths, e.Path)
	}
	log.L(context.Background()).Debug("overlay checkpoint captured", "checkpoint", m.ID, "level", m.Level.String(),
		"files_changed", out.FilesChanged, "bytes_copied", p.copied, "walked", p.res.walked, "duration", out.Duration,
		"scan", p.scanned.Sub(p.start), "copy", p.copyEnd.Sub(p.scanned), "commit", time.Since(p.copyEnd))
	return out, nil
}

// Changed returns how many paths the prepared checkpoint records and how many content
// bytes it copied.
func (p *PendingCapture) Changed() (int, int64) { return len(p.m.Entries), p.copied }

// Abort drops a prepared capture and releases the store. It is a no-op after Commit.
func (p *PendingCapture) Abort() {
	s := p.s
	if s == nil {
		return
	}
	p.s = nil
	p.pw.abort()
	s.prepareTemp()
	s.mu.Unlock()
}

// captureRoot returns the upper dir's own metadata when a full capture needs it or it moved
// since the latest checkpoint (nil otherwise), and its key. Writes through the merged mount to
// "/" (chmod, chown, xattrs, utimes; entries made or removed there move its mtime) land on the
// upper dir itself, which no entry path names.
func (s *Store) captureRoot(rootfd int, full bool) (*Entry, Key, error) {
	var st unix.Stat_t
	if err := unix.Fstat(rootfd, &st); err != nil {
		return nil, Key{}, fmt.Errorf("stat upper root: %w", err)
	}
	key := keyOf(&st)
	if !full && s.root != nil && key == s.rootKey {
		return nil, key, nil
	}
	e, err := describeRoot(rootfd, &st)
	if err != nil {
		return nil, key, err
	}
	if !full && sameMeta(e, s.root) {
		return nil, key, nil
	}
	return e, key, nil
}

// describeRoot records the metadata of the directory open as fd, as path ".".
func describeRoot(fd int, st *unix.Stat_t) (*Entry, error) {
	e := entryFromStat(".", st)
	x, _, err := readXattrsAt(fd, ".") // "/proc/self/fd/N" alone is the magic link
	if err != nil {
		return nil, fmt.Errorf("read upper root xattrs: %w", err)
	}
	e.Xattrs = x
	return e, nil
}

// sameMeta reports whether two directory records agree on everything a rollback restores.
func sameMeta(a, b *Entry) bool {
	return a != nil && b != nil && a.Mode == b.Mode && a.UID == b.UID && a.GID == b.GID &&
		a.Mtime == b.Mtime && sameXattrs(a.Xattrs, b.Xattrs)
}

// checkCapture validates a capture request against the store.
func (s *Store) checkCapture(req CaptureRequest) error {
	if err := validateID(req.ID); err != nil {
		return err
	}
	if req.Level != L1 && req.Level != L2 {
		return fmt.Errorf("level %d: %w", req.Level, errdefs.ErrInvalidArgument)
	}
	if req.Upper == "" {
		return fmt.Errorf("no upper dir: %w", errdefs.ErrInvalidArgument)
	}
	if s.position(req.ID) >= 0 {
		return fmt.Errorf("checkpoint exists: %w", errdefs.ErrAlreadyExists)
	}
	if latest := s.latestID(); req.Parent != latest {
		return fmt.Errorf("parent %q is not the head checkpoint %q: %w", req.Parent, latest, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// copyCheckpoint copies changed contents into a new pack and returns its manifest, to be
// committed.
func (s *Store) copyCheckpoint(rootfd int, req CaptureRequest, full bool, res *scanResult) (*manifest, *packWriter, int64, error) {
	m := &manifest{Version: manifestVer, ID: req.ID, Parent: req.Parent, Level: req.Level, Full: full,
		Upper: req.Upper, Lower: req.Lower, Created: time.Now().UTC(), Index: map[string]*Key{}}
	if n := len(s.chain); n > 0 {
		m.Seq = s.chain[n-1].Seq + 1
	}
	if s.pending != nil {
		m.Rollback = s.pending.Nonce
		if !full {
			applyPending(m.Index, s.pending.Index)
		}
	}
	f, err := s.tempFile()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("create pack: %w", err)
	}
	pw := s.newPack(f)
	copied, err := s.addEntries(pw, rootfd, m, res)
	s.packWritten(pw)
	if err != nil {
		pw.abort()
		return nil, nil, 0, err
	}
	if full {
		s.addUnchangedKeys(m, res)
	}
	return m, pw, copied, nil
}

// applyPending copies a pending rollback's index moves into a manifest's index delta.
func applyPending(dst, delta map[string]*Key) {
	for p, k := range delta {
		dst[p] = k
	}
}

// addEntries records the scan's changes in m, copying file contents (once per inode).
func (s *Store) addEntries(pw *packWriter, rootfd int, m *manifest, res *scanResult) (int64, error) {
	type extent struct {
		off int64
		sum uint64
	}
	offs := map[uint64]extent{}
	var copied int64
	for _, c := range res.changed {
		e := c.entry
		e.ckpt = m.ID
		k := keyOf(&c.st)
		m.Index[e.Path] = &k
		if e.Kind == KindFile && e.Size > 0 {
			ext, seen := offs[c.st.Ino]
			if !seen {
				var err error
				if ext.off, ext.sum, err = copyIn(pw, rootfd, e); err != nil {
					return 0, err
				}
				offs[c.st.Ino] = ext
				copied += e.Size
			}
			e.Off, e.Sum, e.summed = ext.off, ext.sum, true
		}
		m.Entries = append(m.Entries, e)
	}
	// Gone paths are recorded by full checkpoints too (they are no-ops when folding one): a
	// rollback needs every path whose upper-dir representation changed after its target.
	for _, p := range res.gone {
		m.Entries = append(m.Entries, &Entry{Path: p, Kind: KindGone, ckpt: m.ID})
		if !m.Full {
			m.Index[p] = nil
		}
	}
	return copied, nil
}

// addUnchangedKeys completes a full checkpoint's index with the keys of unchanged paths.
func (s *Store) addUnchangedKeys(m *manifest, res *scanResult) {
	for p, ie := range s.idx.keys {
		if _, ok := m.Index[p]; !ok && ie.gen == res.gen {
			k := ie.key
			m.Index[p] = &k
		}
	}
}

// copyIn copies one upper file's content into the pack and returns where, with its digest.
func copyIn(pw *packWriter, rootfd int, e *Entry) (int64, uint64, error) {
	fd, err := openBeneath(rootfd, e.Path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME)
	if err != nil {
		return 0, 0, fmt.Errorf("open upper %q: %w", e.Path, err)
	}
	defer unix.Close(fd)
	off, sum, err := pw.addFrom(fd, 0, e.Size)
	if err != nil {
		return 0, 0, fmt.Errorf("copy upper %q: %w", e.Path, err)
	}
	return off, sum, nil
}

// commitCapture moves the in-memory state to the new checkpoint.
func (s *Store) commitCapture(m *manifest, f *os.File, res *scanResult) {
	s.chain = append(s.chain, m)
	s.head = m.ID
	s.packs[m.ID] = f
	if m.Full {
		s.state = map[string]*Entry{}
	}
	applyEntries(s.state, m.Entries)
	s.idx.apply(res)
	if s.pending != nil {
		_ = os.Remove(filepath.Join(s.dir, rollbackFile)) // the manifest names its nonce
		s.pending = nil
	}
}
