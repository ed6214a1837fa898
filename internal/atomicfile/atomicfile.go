// Package atomicfile replaces files so that a crash leaves either the old or the new content,
// never a torn mix: the data goes to a temp file in the same directory, is fsynced, renamed
// over the target, and the directory is fsynced so the rename itself is durable.
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile replaces path with data and mode durably (temp file, fsync, rename, dir fsync).
// The temp file is removed on failure. Errors are returned unwrapped; callers add context.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // a no-op after the rename
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs a directory so that the entries created, renamed or removed in it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
