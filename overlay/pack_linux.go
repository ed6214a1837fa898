//go:build linux

package overlay

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A pack is one checkpoint on disk: file contents (each at Entry.Off), then the JSON manifest,
// then a fixed footer that locates the manifest. Written under a temp name and renamed, so a
// pack either exists complete or not at all.
const (
	packMagic    = "DBXOVL01"
	footerSize   = 8 + 8 + 4 + 4
	packSuffix   = ".ckpt"
	tempPrefix   = ".tmp-"
	reflinkAlign = 4096
	// manifestVer 2 added a content digest (Entry.Sum, XXH3-64) to every file entry with
	// data; packs of version 1 still load, their contents unchecked.
	manifestVer    = 2
	minManifestVer = 1
)

// manifest is the durable record of one checkpoint.
type manifest struct {
	Version  int             `json:"version"`
	ID       string          `json:"id"`
	Parent   string          `json:"parent,omitempty"`
	Seq      uint64          `json:"seq"`
	Level    Level           `json:"level"`
	Full     bool            `json:"full"` // self-contained: Entries is the whole upper dir
	Upper    string          `json:"upper,omitempty"`
	Lower    []string        `json:"lower,omitempty"`
	Created  time.Time       `json:"created"`
	Rollback string          `json:"rollback,omitempty"` // nonce of the rollback it absorbed
	Absorbed string          `json:"absorbed,omitempty"` // the deleted parent it absorbed (see Delete)
	Folded   []string        `json:"folded,omitempty"`   // the deleted ancestors it absorbed with Absorbed (PrepareFold)
	Entries  []*Entry        `json:"entries"`
	Index    map[string]*Key `json:"index"`          // change-detection keys; nil deletes
	Meta     json.RawMessage `json:"meta,omitempty"` // the caller's record of the checkpoint
	// Root is the upper dir's own metadata (mode, owner, mtime, xattrs; path "."), when it
	// changed since the previous checkpoint (always in a full one).
	Root *Entry `json:"root,omitempty"`
}

// packWriter writes one pack file.
type packWriter struct {
	f       *os.File
	off     int64
	reflink bool
	sync    bool
	done    bool
	// cloneFailed: a clone was refused, and the writer copies since (Store.packWritten).
	cloneFailed bool
}

// newPackWriter writes a pack into an empty temp file of the store dir.
func newPackWriter(f *os.File, reflink, sync bool) *packWriter {
	return &packWriter{f: f, reflink: reflink, sync: sync}
}

// addFrom copies size bytes of srcFd (from offset srcOff) into the pack and returns where,
// with the content's digest. It clones extents (FICLONERANGE) when the filesystem supports it
// (and then reads the source once for the digest); otherwise the data passes through a buffer
// once, digested on the way.
func (w *packWriter) addFrom(srcFd int, srcOff, size int64) (int64, uint64, error) {
	if w.reflink {
		w.off = (w.off + reflinkAlign - 1) &^ (reflinkAlign - 1)
		if w.clone(srcFd, srcOff, size) == nil {
			at := w.off
			sum, err := digestRange(srcFd, srcOff, size)
			if err != nil {
				return 0, 0, err
			}
			w.off += size
			return at, sum, nil
		}
		w.reflink, w.cloneFailed = false, true
	}
	at := w.off
	sum, err := copyDigest(srcFd, srcOff, int(w.f.Fd()), at, size)
	if err != nil {
		return 0, 0, err
	}
	w.off += size
	return at, sum, nil
}

// clone reflinks a whole, block-aligned range; the tail of a file that is not block aligned
// cannot be cloned, so only exact-size clones at EOF are attempted.
func (w *packWriter) clone(srcFd int, srcOff, size int64) error {
	if size == 0 {
		return nil
	}
	return unix.IoctlFileCloneRange(int(w.f.Fd()), &unix.FileCloneRange{
		Src_fd: int64(srcFd), Src_offset: uint64(srcOff), Src_length: 0, Dest_offset: uint64(w.off),
	})
}

// copyRange copies size bytes between two fds at explicit offsets.
func copyRange(src int, srcOff int64, dst int, dstOff int64, size int64) (int64, error) {
	var done int64
	for done < size {
		so, do := srcOff+done, dstOff+done
		n, err := unix.CopyFileRange(src, &so, dst, &do, int(size-done), 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
			m, err := copyPread(src, srcOff+done, dst, dstOff+done, size-done)
			return done + m, err
		}
		if err != nil {
			return done, fmt.Errorf("copy_file_range: %w", err)
		}
		if n == 0 {
			break
		}
		done += int64(n)
	}
	return done, nil
}

// copyPread is the portable fallback of copyRange.
func copyPread(src int, srcOff int64, dst int, dstOff int64, size int64) (int64, error) {
	buf := make([]byte, min(size, 1<<20))
	var done int64
	for done < size {
		n, err := unix.Pread(src, buf[:min(int64(len(buf)), size-done)], srcOff+done)
		if err != nil {
			return done, fmt.Errorf("read: %w", err)
		}
		if n == 0 {
			return done, nil
		}
		if _, err := unix.Pwrite(dst, buf[:n], dstOff+done); err != nil {
			return done, fmt.Errorf("write: %w", err)
		}
		done += int64(n)
	}
	return done, nil
}

// commit appends the manifest and footer, makes the pack durable and renames it to final.
func (w *packWriter) commit(m *manifest, final string) error {
	if err := w.seal(m); err != nil {
		return err
	}
	if err := os.Rename(w.f.Name(), final); err != nil {
		return fmt.Errorf("rename pack: %w", err)
	}
	w.done = true
	if w.sync {
		return syncDir(filepath.Dir(final))
	}
	return nil
}

// seal writes the manifest and footer after the contents and syncs the pack (commit without
// the rename).
func (w *packWriter) seal(m *manifest) error {
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	foot := make([]byte, footerSize)
	copy(foot, packMagic)
	binary.LittleEndian.PutUint64(foot[8:], uint64(w.off))
	binary.LittleEndian.PutUint32(foot[16:], uint32(len(data)))
	binary.LittleEndian.PutUint32(foot[20:], crc32.ChecksumIEEE(data))
	if _, err := w.f.WriteAt(append(data, foot...), w.off); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if w.sync {
		if err := unix.Fdatasync(int(w.f.Fd())); err != nil {
			return fmt.Errorf("fsync pack: %w", err)
		}
	}
	return nil
}

// file returns the committed pack, open for reading.
func (w *packWriter) file() *os.File { return w.f }

// abort removes an uncommitted pack (or closes a committed one).
func (w *packWriter) abort() {
	if w.f != nil && w.done {
		_ = w.f.Close()
		w.f = nil
	}
	if w.f != nil {
		_ = os.Remove(w.f.Name())
		_ = w.f.Close()
		w.f = nil
	}
}

// syncDir fsyncs a directory so renames and removals in it are durable.
func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// readManifest reads and verifies the manifest of a pack.
func readManifest(f *os.File) (*manifest, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < footerSize {
		return nil, fmt.Errorf("pack %s too short: %w", f.Name(), errdefs.ErrDataLoss)
	}
	foot := make([]byte, footerSize)
	if _, err := f.ReadAt(foot, st.Size()-footerSize); err != nil {
		return nil, fmt.Errorf("read footer of %s: %w", f.Name(), err)
	}
	off := int64(binary.LittleEndian.Uint64(foot[8:]))
	n := int64(binary.LittleEndian.Uint32(foot[16:]))
	if string(foot[:8]) != packMagic || off+n+footerSize != st.Size() {
		return nil, fmt.Errorf("pack %s: bad footer: %w", f.Name(), errdefs.ErrDataLoss)
	}
	data := make([]byte, n)
	if _, err := f.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read manifest of %s: %w", f.Name(), err)
	}
	if crc32.ChecksumIEEE(data) != binary.LittleEndian.Uint32(foot[20:]) {
		return nil, fmt.Errorf("pack %s: manifest checksum mismatch: %w", f.Name(), errdefs.ErrDataLoss)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decode manifest of %s: %w", f.Name(), err)
	}
	return &m, m.validate()
}

// validate rejects manifests whose paths could escape a root when replayed.
func (m *manifest) validate() error {
	if m.Version < minManifestVer || m.Version > manifestVer {
		return fmt.Errorf("manifest %s: version %d: %w", m.ID, m.Version, errdefs.ErrNotImplemented)
	}
	if err := validateID(m.ID); err != nil {
		return err
	}
	for _, e := range m.Entries {
		if _, err := cleanRel(e.Path); err != nil {
			return fmt.Errorf("manifest %s: %w: %w", m.ID, err, errdefs.ErrDataLoss)
		}
		e.ckpt = m.ID
		e.summed = m.Version >= 2 && e.Kind == KindFile && e.Size > 0
	}
	return nil
}

// writeFileRenamed writes data to path through the empty temp file f (same directory),
// fdatasync and rename; the rename is durable only after the caller fsyncs the directory.
func writeFileRenamed(f *os.File, path string, data []byte, sync bool) error {
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if sync {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return err
		}
	}
	return os.Rename(f.Name(), path)
}
