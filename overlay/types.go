package overlay

import (
	"fmt"
	"regexp"
	"time"

	"github.com/containerd/errdefs"
)

// Level says how much a checkpoint holds.
type Level int

const (
	// L1 records only what changed in the upper dir since the parent checkpoint.
	L1 Level = 1
	// L2 records a full copy of the upper dir; it is self-contained.
	L2 Level = 2
)

func (l Level) String() string {
	switch l {
	case L1:
		return "L1"
	case L2:
		return "L2"
	}
	return fmt.Sprintf("Level(%d)", int(l))
}

// Kind is the type of a filesystem entry as recorded in a checkpoint.
type Kind string

// Entry kinds. KindWhiteout is overlayfs's deletion marker (a 0/0 character device) and
// KindGone records that a path left the upper dir (it shows the lower content again, if any).
const (
	KindFile     Kind = "file"
	KindDir      Kind = "dir"
	KindSymlink  Kind = "symlink"
	KindFifo     Kind = "fifo"
	KindChar     Kind = "char"
	KindBlock    Kind = "block"
	KindSocket   Kind = "socket"
	KindWhiteout Kind = "whiteout"
	KindGone     Kind = "gone"
)

// Key is what change detection compares: a path whose key differs from the indexed one has
// changed. ctime moves on every content, link-count, owner, mode and xattr change (Linux >=
// 6.13 gives ext4/xfs/btrfs/tmpfs fine-grained ctimes once a ctime was observed), so together
// with the inode number it is a sufficient change signal.
type Key struct {
	Ino   uint64 `json:"i"`
	Ctime int64  `json:"c"`
	Mtime int64  `json:"m"`
	Size  int64  `json:"s"`
	Mode  uint32 `json:"o"`
}

// Entry is the recorded state of one upper-dir path (relative, slash-separated).
type Entry struct {
	Path   string            `json:"p"`
	Kind   Kind              `json:"k"`
	Mode   uint32            `json:"mode,omitempty"` // permission and setuid/setgid/sticky bits
	UID    uint32            `json:"uid,omitempty"`
	GID    uint32            `json:"gid,omitempty"`
	Mtime  int64             `json:"mtime,omitempty"` // nanoseconds since the epoch
	Size   int64             `json:"size,omitempty"`
	Rdev   uint64            `json:"rdev,omitempty"`
	Target string            `json:"target,omitempty"` // symlink target, never resolved
	Opaque bool              `json:"opaque,omitempty"` // trusted.overlay.opaque=y
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
	Link   string            `json:"link,omitempty"` // hard-link group (inode identity), shared by its paths
	Off    int64             `json:"off,omitempty"`  // content offset in the pack of ckpt
	Sum    uint64            `json:"xxh3,omitempty"` // XXH3-64 of the content (manifest version >= 2)

	ckpt   string // checkpoint whose pack holds the content
	lower  string // for entries resolved from a lower dir: the layer root
	summed bool   // Sum was recorded and is checked before the content is used
}

// CaptureRequest asks for a checkpoint of a sandbox's upper dir.
type CaptureRequest struct {
	ID     string   // new checkpoint ID, a safe path component
	Parent string   // the store's latest checkpoint, "" for the first one
	Level  Level    // L1 (delta) or L2 (full)
	Upper  string   // the overlay upper dir (read only)
	Lower  []string // the overlay lower dirs, topmost first (recorded for Diff/Export)
	// Open are the files the sandbox's processes hold open for writing or have mapped shared
	// and writable (WritableFiles lists them): changes the change tracker may not have seen.
	Open OpenFiles
	// Meta is stored with the checkpoint, made durable with it, and returned by Store.Meta
	// (JSON; Capture only: Prepare's caller passes it to Commit).
	Meta []byte
}

// CaptureResult describes a stored checkpoint.
type CaptureResult struct {
	ID           string        `json:"id"`
	Level        Level         `json:"level"`
	FilesChanged int           `json:"files_changed"`
	BytesCopied  int64         `json:"bytes_copied"`
	Paths        []string      `json:"paths"`
	Duration     time.Duration `json:"duration"`
}

// RollbackRequest asks to bring a sandbox's merged mount back to checkpoint Target.
type RollbackRequest struct {
	Merged string    // the mounted merged dir (written through)
	Upper  string    // the upper dir (read only)
	Lower  []string  // the lower dirs, topmost first
	Target string    // checkpoint to restore
	Open   OpenFiles // as in CaptureRequest
	// IDs (RestoreInto only) is the other sandbox's user namespace mapping, when it has one:
	// owners in this store's host range are moved into it, and its image shows through it.
	IDs *IDRange
	// Meta is kept with the rollback's record and returned by Store.HeadMeta until the next
	// capture (JSON).
	Meta []byte
	// BeforeWrite, when set, runs once the rollback is worked out and every content it needs
	// is open and has passed its digest check, just before the first write; its error stops
	// the rollback with nothing written. A rollback that fails before it (a damaged target:
	// DamageError) has changed nothing.
	BeforeWrite func() error
	// Deferred leaves the rollback's record unwritten: the store's head moves to the target
	// in memory only, and the caller writes the record with PersistRollback once it has
	// thawed the sandbox (so that the write and its syncs stay out of the frozen window).
	// Until then a crash leaves the old head on disk (the caller's own intent must redo the
	// rollback); the next Capture, Delete or Rollback writes it first.
	Deferred bool
}

// RollbackResult lists what a rollback restored.
type RollbackResult struct {
	FilesRestored int      `json:"files_restored"`
	Paths         []string `json:"paths"`
	// Prepared says that a PreparedRollback's plan was applied as prepared (its check found
	// nothing moved since), not worked out again in the window.
	Prepared bool `json:"-"`
	// Phases are the rollback's spans. A Deferred rollback (one in a frozen window) leaves
	// its debug line to the caller, to write once the sandbox runs again.
	Phases RollbackPhases `json:"-"`
}

// RollbackPhases are how long a rollback's phases took (the debug log's spans). For a
// PreparedRollback, Total is the time of its Rollback call (the frozen window's part); Check
// is the check that the prepared plan still holds, and Scan and Plan are the preparation's
// when the plan held (Prepared), else the window's.
type RollbackPhases struct {
	Total, Check, Scan, Plan, BeforeWrite, Write, Index time.Duration
	Prepared                                            bool
	// Replanned says why a prepared plan was worked out again in the window ("" when it
	// was applied, or when the rollback was not prepared).
	Replanned string
}

// LogArgs returns the phases as a log line's key-value pairs.
func (p RollbackPhases) LogArgs() []any {
	return []any{"duration", p.Total, "prepared", p.Prepared, "check", p.Check, "scan", p.Scan, "plan", p.Plan,
		"before_write", p.BeforeWrite, "write", p.Write, "index", p.Index, "replanned", p.Replanned}
}

// Change says how a path differs between two states.
type Change string

// Diff change kinds.
const (
	Added    Change = "added"
	Modified Change = "modified"
	Deleted  Change = "deleted"
)

// DiffEntry is one path that differs between two states of the merged tree.
type DiffEntry struct {
	Path   string `json:"path"`
	Change Change `json:"change"`
	Kind   Kind   `json:"kind"`
	Size   int64  `json:"size"` // size in the newer state, or the deleted entry's size
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// validateID rejects checkpoint IDs that are not safe as a single path component.
func validateID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("checkpoint id %q: want [A-Za-z0-9._-], at most 128 chars: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Mismatch is one way the merged tree differs from a checkpoint's recorded state. What names
// the difference: missing (recorded, not in the tree), extra (in the tree, not recorded),
// type, mode, owner (uid:gid), size, content (sha256 of both sides), target (symlink), rdev,
// xattrs, link (a recorded hard link is broken), mtime (only with VerifyMtimes) or damaged
// (the checkpoint's stored content no longer matches its digest; Got says how).
type Mismatch struct {
	Path string `json:"path"`
	What string `json:"what"`
	Want string `json:"want"`
	Got  string `json:"got"`
}

// IDRange is a user namespace mapping: ids 0..Size-1 inside are host ids Host..Host+Size-1.
type IDRange struct{ Host, Size uint32 }
