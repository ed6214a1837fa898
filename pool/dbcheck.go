package pool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

// The pool database is checked before bbolt maps it: bbolt reads its pages through mmap, and
// a file shorter than its own meta page says (cut by a full disk, a bad copy, a crash of the
// filesystem) makes the first read past the end a SIGBUS, which kills the process and cannot
// be recovered. A damaged database is set aside, what can still be read from it is salvaged
// into a fresh one, and reconcile then treats every container whose record did not survive
// with suspicion (quarantine), never by destroying a leased sandbox.

// bbolt's on-disk constants (format version 2): each of the first two pages holds a page
// header (16 bytes) then the meta.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	boltPageHeader = 16
	boltMetaSize   = 64 // magic .. checksum
	boltMetaSumOff = 56 // the checksum covers the meta up to here
)

// boltMeta is the part of a meta page the check needs.
type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64 // high water mark: pages [0, pgid) must be in the file
	txid     uint64
}

// checkBoltFile reports why the database file at path cannot be mapped safely ("" when it
// can, or when it does not exist).
func checkBoltFile(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if st.Size() == 0 {
		return "", nil // bbolt initialises an empty file
	}
	m, why := bestMeta(f, st.Size())
	if why != "" {
		return why, nil
	}
	if need := int64(m.pgid) * int64(m.pageSize); need > st.Size() {
		return fmt.Sprintf("the file is %d bytes, its meta page says %d (%d pages of %d): it was cut short", st.Size(), need, m.pgid, m.pageSize), nil
	}
	if m.root >= m.pgid || (m.freelist >= m.pgid && m.freelist != ^uint64(0)) {
		return fmt.Sprintf("its meta page names page %d/%d beyond its %d pages", m.root, m.freelist, m.pgid), nil
	}
	return "", nil
}

// bestMeta returns the valid meta page with the highest transaction ID, as bbolt chooses.
func bestMeta(f io.ReaderAt, size int64) (boltMeta, string) {
	first, why0 := readMeta(f, 0, size)
	if why0 != "" {
		return boltMeta{}, "meta page 0: " + why0
	}
	second, why1 := readMeta(f, int64(first.pageSize), size)
	switch {
	case why1 != "":
		return first, ""
	case second.txid > first.txid:
		return second, ""
	}
	return first, ""
}

func readMeta(f io.ReaderAt, off, size int64) (boltMeta, string) {
	if off+boltPageHeader+boltMetaSize > size {
		return boltMeta{}, fmt.Sprintf("the file (%d bytes) ends before it", size)
	}
	b := make([]byte, boltMetaSize)
	if _, err := f.ReadAt(b, off+boltPageHeader); err != nil {
		return boltMeta{}, err.Error()
	}
	le := binary.LittleEndian
	if le.Uint32(b) != boltMagic || le.Uint32(b[4:]) != boltVersion {
		return boltMeta{}, "not a bbolt meta page"
	}
	h := fnv.New64a()
	_, _ = h.Write(b[:boltMetaSumOff])
	if h.Sum64() != le.Uint64(b[boltMetaSumOff:]) {
		return boltMeta{}, "checksum mismatch"
	}
	m := boltMeta{pageSize: le.Uint32(b[8:]), root: le.Uint64(b[16:]), freelist: le.Uint64(b[32:]),
		pgid: le.Uint64(b[40:]), txid: le.Uint64(b[48:])}
	if m.pageSize < 512 || m.pageSize > 1<<20 || m.pageSize&(m.pageSize-1) != 0 {
		return boltMeta{}, fmt.Sprintf("page size %d", m.pageSize)
	}
	return m, ""
}

// checkOpenDB runs bbolt's own consistency check of every page (a panic inside it, from a
// page it cannot parse, is a failed check too).
func checkOpenDB(db *bolt.DB) (why string) {
	defer func() {
		if r := recover(); r != nil {
			why = fmt.Sprintf("bbolt check panicked: %v", r)
		}
	}()
	err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return ""
}

// setAsideDB renames a damaged database out of the way (kept for the operator) and returns
// the new name.
func setAsideDB(path string) (string, error) {
	to := fmt.Sprintf("%s.damaged-%d", path, time.Now().UnixNano())
	if err := os.Rename(path, to); err != nil {
		return "", fmt.Errorf("set aside damaged pool database: %w", err)
	}
	return to, nil
}

// salvage copies what can still be read of a set-aside database into the fresh store s: the
// file is copied and padded to the size its meta page claims (so no read can run past the
// end), opened read-only, and every bucket entry that can be read is put into s. A panic from
// a damaged page ends the salvage of that bucket; entries are checked later, one by one, when
// they are decoded.
func salvage(s *store, damaged string) (int, error) {
	tmp, err := paddedCopy(damaged)
	if tmp != "" {
		defer os.Remove(tmp)
	}
	if err != nil {
		return 0, err
	}
	old, err := bolt.Open(tmp, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, fmt.Errorf("open the damaged pool database read-only: %w", err)
	}
	defer old.Close()
	n := 0
	for _, b := range [][]byte{bucketPools, bucketContainers} {
		kvs := readBucket(old, b)
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, kv := range kvs {
				if err := tx.Bucket(b).Put(kv[0], kv[1]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return n, err
		}
		n += len(kvs)
	}
	return n, nil
}

// readBucket returns the entries of bucket b it can read before a damaged page stops it.
func readBucket(db *bolt.DB, b []byte) (out [][2][]byte) {
	defer func() { _ = recover() }()
	_ = db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(b)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			if v != nil {
				out = append(out, [2][]byte{append([]byte(nil), k...), append([]byte(nil), v...)})
			}
			return nil
		})
	})
	return out
}

// paddedCopy copies a damaged database to a temp file at least as long as its meta pages
// claim (zero pages past the real end).
func paddedCopy(path string) (string, error) {
	src, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return "", err
	}
	m, why := bestMeta(src, st.Size())
	if why != "" {
		return "", fmt.Errorf("nothing to salvage: %s: %w", why, errdefs.ErrDataLoss)
	}
	dst, err := os.CreateTemp(os.TempDir(), "deltabox-pooldb-salvage-")
	if err != nil {
		return "", err
	}
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		return dst.Name(), err
	}
	size := max(st.Size(), int64(m.pgid)*int64(m.pageSize))
	return dst.Name(), dst.Truncate(size)
}
