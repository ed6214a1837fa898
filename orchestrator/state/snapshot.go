package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
)

const snapshotName = "snapshot.json"

// snapshotFile is a full copy of the document at Seq. The log holds everything up to Seq
// durably before the snapshot is written, so replay starts at Seq and never needs older ops.
type snapshotFile struct {
	Seq uint64          `json:"seq"`
	Doc json.RawMessage `json:"doc"`
}

// writeSnapshot replaces dir's snapshot atomically: temp file, fsync, rename, fsync of dir.
func writeSnapshot(dir string, seq uint64, doc []byte) error {
	data, err := json.Marshal(snapshotFile{Seq: seq, Doc: doc})
	if err != nil {
		return fmt.Errorf("encode snapshot: %w", err)
	}
	return writeFileAtomic(dir, snapshotName, data)
}

// readSnapshot returns the snapshot in dir, or the empty document at 0 if there is none.
func readSnapshot(dir string) (uint64, any, error) {
	data, err := os.ReadFile(filepath.Join(dir, snapshotName))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, map[string]any{}, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read snapshot: %w", err)
	}
	var sf snapshotFile
	if err := json.Unmarshal(data, &sf); err != nil {
		return 0, nil, fmt.Errorf("decode snapshot: %v: %w", err, errdefs.ErrDataLoss)
	}
	doc, err := decodeValue(sf.Doc)
	if err != nil {
		return 0, nil, fmt.Errorf("decode snapshot document: %v: %w", err, errdefs.ErrDataLoss)
	}
	return sf.Seq, doc, nil
}

// writeFileAtomic writes name in dir so that a crash leaves either the old or the new file.
func writeFileAtomic(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	return renameDurably(dir, filepath.Base(tmp.Name()), name)
}

// renameDurably renames within dir and fsyncs dir so the rename survives a crash.
func renameDurably(dir, from, to string) error {
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		return fmt.Errorf("rename %s: %w", to, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
