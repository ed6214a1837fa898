//go:build linux

package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/log"
)

// Store is the layer store of one sandbox: a tree of checkpoints (each names its parent;
// chain holds them in capture order) with a head, the checkpoint the upper dir is relative
// to (the latest capture or the target of the latest rollback), plus the in-memory
// change-detection index of the upper dir as of the head. A rollback may go to any
// checkpoint of the tree: it restores every path changed on the way from the head up to
// the common ancestor and down to the target. It is safe for concurrent use; operations
// are serialized.
type Store struct {
	mu      sync.Mutex
	dir     string
	opts    options
	chain   []*manifest         // every checkpoint, in capture order
	head    string              // the current checkpoint ("" for an empty store)
	packs   map[string]*os.File // open pack files by checkpoint ID
	idx     *index              // upper dir as of the head (and the pending rollback)
	state   map[string]*Entry   // upper state at the head
	root    *Entry              // the upper dir's own metadata at the head
	rootKey Key                 // its change-detection key (zero: unknown, record it again)
	pending *rollbackRecord     // rollback not yet absorbed by a capture
	// unwritten: pending is a Deferred rollback's record, not yet on disk (PersistRollback).
	unwritten bool
	// unsynced: the record was put in place by WriteRollback and is not yet durable.
	unsynced bool
	trk      *tracker       // change tracker of the upper dir (nil until the first scan)
	spare    chan *os.File  // an empty temp file made in the background (see tempFile)
	bg       sync.WaitGroup // background temp file creation
	making   atomic.Bool    // a background creation is under way (at most one at a time)
	damaged  []Damage       // checkpoints set aside as damaged (see setAside)
	fold     *folded        // the folded lower layer, once read (WithFoldedLower)
	// noClone: the store's filesystem cannot clone extents (ext4), as probeClone found at open
	// or a pack writer since: pack writers copy from the start (newPack), and merges copy in
	// runs (copyContentsBulk).
	noClone bool
	// unfinished are the packs of committed folds not yet removed (PreparedFold.Finish).
	unfinished []string
}

// newPack is a pack writer into f, cloning extents unless the filesystem is known to refuse
// it. Callers hold s.mu.
func (s *Store) newPack(f *os.File) *packWriter {
	return newPackWriter(f, s.opts.reflink && !s.noClone, s.opts.sync)
}

// probeClone reports whether the filesystem of dir clones extents: a block written to a
// temp file there is cloned onto the same file further on. Asked once, when a store opens
// (never in a frozen window).
func probeClone(dir string) bool {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return false
	}
	defer discardTemp(f)
	if _, err := f.WriteAt(make([]byte, reflinkAlign), 0); err != nil {
		return false
	}
	err = unix.IoctlFileCloneRange(int(f.Fd()), &unix.FileCloneRange{
		Src_fd: int64(f.Fd()), Src_offset: 0, Src_length: reflinkAlign, Dest_offset: reflinkAlign,
	})
	return err == nil
}

// packWritten notes what a pack writer found out about clones. Callers hold s.mu.
func (s *Store) packWritten(pw *packWriter) {
	if pw.cloneFailed {
		s.noClone = true
	}
}

// Option configures a Store.
type Option func(*options)

type options struct {
	workers int
	sync    bool
	reflink bool
	track   bool
	ids     idShift
	fold    string // WithFoldedLower
}

// WithScanWorkers sets how many goroutines stat the upper dir in parallel (default 2).
func WithScanWorkers(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.workers = n
		}
	}
}

// WithoutSync skips fsync; for tests and benchmarks that measure the non-durable cost only.
func WithoutSync() Option { return func(o *options) { o.sync = false } }

// WithoutTracking makes every scan walk the whole upper dir instead of statting only the
// paths the change tracker saw change; for comparisons and for filesystems without inotify.
func WithoutTracking() Option { return func(o *options) { o.track = false } }

// WithLowerIDs says the sandbox sees its lower layers through idmapped mounts (a user
// namespace): their ids 0..size-1 show as host ids host..host+size-1, which is what the
// upper dir holds too. Rollback and Verify then treat the lower layers' owners as mapped.
func WithLowerIDs(host, size uint32) Option {
	return func(o *options) { o.ids = idShift{host, size} }
}

// WithoutReflink disables FICLONE attempts (copy_file_range is used).
func WithoutReflink() Option { return func(o *options) { o.reflink = false } }

// rollbackRecord is the durable trace of a rollback: the target became the head and the
// upper dir's index moved by Index (relative to the target's index). Meta is the caller's
// (RollbackRequest.Meta), returned by HeadMeta until the next capture absorbs the record.
type rollbackRecord struct {
	Nonce  string          `json:"nonce"`
	Target string          `json:"target"`
	Index  map[string]*Key `json:"index"`
	Meta   json.RawMessage `json:"meta,omitempty"`
}

const rollbackFile = "rollback.json"

// NewStore opens (creating if needed) the layer store in dir. It drops leftovers of an
// interrupted capture, finishes an interrupted rollback or delete, and rebuilds the index, so
// a restarted daemon continues where the last durable checkpoint left off.
func NewStore(dir string, opts ...Option) (*Store, error) {
	o := options{workers: 2, sync: true, reflink: true, track: true}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create layer store %s: %w", dir, err)
	}
	s := &Store{dir: dir, opts: o, packs: map[string]*os.File{}, spare: make(chan *os.File, 1)}
	if err := s.load(); err != nil {
		s.Close()
		return nil, fmt.Errorf("open layer store %s: %w", dir, err)
	}
	s.noClone = o.reflink && !probeClone(dir)
	s.prepareTemp()
	return s, nil
}

// Close releases the open pack files.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropSpare()
	s.closeFold()
	if s.trk != nil {
		s.trk.close()
		s.trk = nil
	}
	for id, f := range s.packs {
		f.Close()
		delete(s.packs, id)
	}
	return nil
}

// Meta returns the record stored with checkpoint id (nil when none was given).
func (s *Store) Meta(id string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pos, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	return s.chain[pos].Meta, nil
}

// Checkpoints lists the stored checkpoint IDs, oldest first.
func (s *Store) Checkpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(s.chain))
	for i, m := range s.chain {
		ids[i] = m.ID
	}
	return ids
}

// Latest returns the head: the checkpoint the upper dir is relative to, the latest capture
// or the target of the latest rollback ("" for an empty store). The next capture's parent.
func (s *Store) Latest() string { return s.Head() }

// Head is Latest.
func (s *Store) Head() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head
}

// HeadMeta returns the Meta of the rollback that made the head, until a capture absorbs it
// (nil when the head is the latest capture).
func (s *Store) HeadMeta() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		return nil
	}
	return s.pending.Meta
}

// Parent returns the parent of checkpoint id ("" for a root).
func (s *Store) Parent(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pos, err := s.lookup(id)
	if err != nil {
		return "", err
	}
	return s.chain[pos].Parent, nil
}

func (s *Store) latestID() string { return s.head }

// headPos is the chain position of the head (-1 for an empty store).
func (s *Store) headPos() int { return s.position(s.head) }

// load reads every pack, orders the chain and rebuilds the in-memory state.
func (s *Store) load() error {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, de := range names {
		name := de.Name()
		switch {
		case strings.HasPrefix(name, tempPrefix), strings.HasPrefix(name, ".export-"):
			_ = os.RemoveAll(filepath.Join(s.dir, name))
		case strings.Contains(name, damagedSuffix):
			s.damaged = append(s.damaged, Damage{Checkpoint: name[:strings.Index(name, damagedSuffix)],
				Reason: "set aside as damaged by an earlier start (kept as " + name + ")"})
		case strings.HasSuffix(name, packSuffix):
			if err := s.loadPack(name); err != nil {
				return err
			}
		}
	}
	sort.Slice(s.chain, func(i, j int) bool { return s.chain[i].Seq < s.chain[j].Seq })
	if err := s.repairChain(); err != nil {
		return err
	}
	if n := len(s.chain); n > 0 {
		s.head = s.chain[n-1].ID
	}
	if err := s.loadRollback(); err != nil {
		return err
	}
	return s.rebuild()
}

// loadPack opens one pack and appends its manifest to the (unsorted) chain. A pack whose
// manifest is damaged is set aside (see setAside): it no longer loads, the others do.
func (s *Store) loadPack(name string) error {
	f, err := os.Open(filepath.Join(s.dir, name))
	if err != nil {
		return err
	}
	m, err := readManifest(f)
	if err == nil && m.ID+packSuffix != name {
		err = fmt.Errorf("pack %s holds checkpoint %q: %w", name, m.ID, errdefs.ErrDataLoss)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, errdefs.ErrDataLoss) {
			return s.setAside(strings.TrimSuffix(name, packSuffix), err.Error())
		}
		return err
	}
	s.packs[m.ID] = f
	s.chain = append(s.chain, m)
	return nil
}

// repairChain drops packs left behind by an interrupted Delete (a checkpoint rewritten to
// absorb its parent names it in Absorbed) and checks the tree: a checkpoint that is not
// self-contained needs its parent. Where a parent is missing (a pack is missing or was set
// aside as damaged), the checkpoints that cannot be rebuilt, it and its descendants, are set
// aside; the others stay usable. Parents always come earlier in capture order.
func (s *Store) repairChain() error {
	absorbed := map[string]bool{}
	for _, m := range s.chain {
		if m.Absorbed != "" {
			absorbed[m.Absorbed] = true
		}
		for _, id := range m.Folded {
			absorbed[id] = true
		}
	}
	for id := range absorbed {
		if s.position(id) >= 0 {
			if err := s.removePack(id); err != nil {
				return err
			}
		}
	}
	s.chain = slices.DeleteFunc(s.chain, func(x *manifest) bool { return absorbed[x.ID] })
	for i := 0; i < len(s.chain); i++ {
		m := s.chain[i]
		if m.Full || (m.Parent != "" && s.position(m.Parent) >= 0 && s.position(m.Parent) < i) {
			continue
		}
		reason := fmt.Sprintf("its base (parent %q) is missing or damaged", m.Parent)
		if err := s.setAsideAt(i, reason); err != nil {
			return err
		}
		i--
	}
	return nil
}

// damagedSuffix marks a pack set aside: <id>.ckpt.damaged-<unix nanoseconds>.
const damagedSuffix = packSuffix + ".damaged"

// setAsideAt sets aside the checkpoint at chain position pos (its descendants follow when
// repairChain reaches them).
func (s *Store) setAsideAt(pos int, reason string) error {
	m := s.chain[pos]
	if f := s.packs[m.ID]; f != nil {
		f.Close()
		delete(s.packs, m.ID)
	}
	s.chain = append(s.chain[:pos], s.chain[pos+1:]...)
	return s.setAside(m.ID, reason)
}

// setAside renames a damaged checkpoint's pack out of the chain (it is kept for the operator
// and reported by Damaged) so that the other checkpoints load and a new capture can never
// reuse its name.
func (s *Store) setAside(id, reason string) error {
	from := filepath.Join(s.dir, id+packSuffix)
	to := fmt.Sprintf("%s-%d", filepath.Join(s.dir, id+damagedSuffix), time.Now().UnixNano())
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("set aside damaged checkpoint %s: %w", id, err)
	}
	log.L(context.Background()).Error("checkpoint set aside as damaged", "dir", s.dir, "checkpoint", id,
		"reason", reason, "kept_as", filepath.Base(to))
	s.damaged = append(s.damaged, Damage{Checkpoint: id, Reason: reason + " (kept as " + filepath.Base(to) + ")"})
	if s.opts.sync {
		return syncDir(s.dir)
	}
	return nil
}

// Damaged lists the checkpoints set aside as damaged (this start or an earlier one).
func (s *Store) Damaged() []Damage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Damage(nil), s.damaged...)
}

// loadRollback makes the target of the last rollback the head again, or discards a rollback
// record already absorbed by a later capture.
func (s *Store) loadRollback() error {
	data, err := os.ReadFile(filepath.Join(s.dir, rollbackFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var rec rollbackRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.Target == "" {
		// Renamed into place but its data lost by a power loss before its sync
		// (WriteRollback): the caller's intent redoes that rollback. Every other record was
		// synced before its rename.
		slog.Warn("layer store: rollback record unreadable (cut by a power loss before its sync); the last capture is the head",
			"dir", s.dir, "error", err)
		return os.Remove(filepath.Join(s.dir, rollbackFile))
	}
	for _, m := range s.chain {
		if m.Rollback == rec.Nonce {
			return os.Remove(filepath.Join(s.dir, rollbackFile))
		}
	}
	pos := s.position(rec.Target)
	if pos < 0 {
		return fmt.Errorf("rollback target %s is missing: %w", rec.Target, errdefs.ErrDataLoss)
	}
	s.head, s.pending = rec.Target, &rec
	return nil
}

// rebuild recomputes the head's state and index from the tree (and a pending rollback).
func (s *Store) rebuild() error {
	s.state = map[string]*Entry{}
	s.idx = newIndex(nil)
	n := s.headPos()
	if n < 0 {
		return nil
	}
	s.state, s.root = s.foldState(n), s.foldRoot(n)
	keys := s.foldIndex(n)
	if s.pending != nil {
		applyKeys(keys, s.pending.Index)
	}
	s.idx = newIndex(keys)
	return nil
}

// position returns the chain position of id, or -1.
func (s *Store) position(id string) int {
	for i, m := range s.chain {
		if m.ID == id {
			return i
		}
	}
	return -1
}

// ancestry returns the chain positions from the nearest self-contained ancestor of pos (or
// the root) down to pos, following parent links.
func (s *Store) ancestry(pos int) []int {
	var out []int
	for p := pos; p >= 0; p = s.position(s.chain[p].Parent) {
		out = append(out, p)
		if s.chain[p].Full {
			break
		}
	}
	slices.Reverse(out)
	return out
}

// pathBetween returns the checkpoints passed going from position a up to the common
// ancestor of a and b (up: a first, the ancestor excluded) and down to b (down: the one below
// the ancestor first, b last).
func (s *Store) pathBetween(a, b int) (up, down []int) {
	onA := map[int]bool{}
	for p := a; p >= 0; p = s.position(s.chain[p].Parent) {
		onA[p] = true
	}
	lca := -1
	for p := b; p >= 0; p = s.position(s.chain[p].Parent) {
		if onA[p] {
			lca = p
			break
		}
		down = append(down, p)
	}
	slices.Reverse(down)
	for p := a; p >= 0 && p != lca; p = s.position(s.chain[p].Parent) {
		up = append(up, p)
	}
	return up, down
}

// foldState replays the tree down to pos into the upper state at that checkpoint.
func (s *Store) foldState(pos int) map[string]*Entry {
	st := map[string]*Entry{}
	for _, i := range s.ancestry(pos) {
		applyEntries(st, s.chain[i].Entries)
	}
	return st
}

// foldRoot returns the upper dir's own metadata at pos: the latest recorded at or above it
// (nil for checkpoints of versions that did not record it).
func (s *Store) foldRoot(pos int) *Entry {
	for i := pos; i >= 0; i = s.position(s.chain[i].Parent) {
		if r := s.chain[i].Root; r != nil {
			return r
		}
	}
	return nil
}

// foldIndex replays the index deltas down to pos.
func (s *Store) foldIndex(pos int) map[string]*Key {
	keys := map[string]*Key{}
	for _, i := range s.ancestry(pos) {
		applyKeys(keys, s.chain[i].Index)
	}
	return keys
}

// applyEntries applies a checkpoint's entries to a state.
func applyEntries(st map[string]*Entry, entries []*Entry) {
	for _, e := range entries {
		if e.Kind == KindGone {
			delete(st, e.Path)
			continue
		}
		st[e.Path] = e
	}
}

// applyKeys applies index deltas (nil deletes).
func applyKeys(dst, delta map[string]*Key) {
	for p, k := range delta {
		if k == nil {
			delete(dst, p)
			continue
		}
		dst[p] = k
	}
}

// removePack closes and deletes a checkpoint's pack.
func (s *Store) removePack(id string) error {
	if f := s.packs[id]; f != nil {
		f.Close()
		delete(s.packs, id)
	}
	err := os.Remove(filepath.Join(s.dir, id+packSuffix))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove checkpoint %s: %w", id, err)
	}
	return nil
}

// lookup returns the chain position of id or a NotFound error.
func (s *Store) lookup(id string) (int, error) {
	if err := validateID(id); err != nil {
		return -1, err
	}
	pos := s.position(id)
	if pos < 0 {
		return -1, fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	return pos, nil
}

// stateAt returns the upper state at chain position pos.
func (s *Store) stateAt(pos int) map[string]*Entry {
	if pos == s.headPos() {
		return s.state
	}
	return s.foldState(pos)
}
