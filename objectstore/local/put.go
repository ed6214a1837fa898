package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore/internal/base"
)

// Put writes r to a temp file, syncs it and renames it over the object, so readers see the
// old object or the new one, never a partial one.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := base.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	tmp, err := s.writeTemp(ctx, r, size)
	if err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	if err := s.commit(tmp, key); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// writeTemp copies r into a new synced temp file and returns its path.
func (s *Store) writeTemp(ctx context.Context, r io.Reader, size int64) (path string, err error) {
	f, err := os.CreateTemp(s.tmp, "put-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	n, err := io.Copy(f, base.ContextReader(ctx, r))
	if err != nil {
		return "", err
	}
	if size >= 0 && n != size {
		return "", fmt.Errorf("reader yielded %d bytes, declared size is %d: %w", n, size, errdefs.ErrInvalidArgument)
	}
	if err := f.Chmod(s.perm); err != nil {
		return "", err
	}
	if s.sync {
		if err := f.Sync(); err != nil {
			return "", err
		}
	}
	return f.Name(), f.Close()
}

// commit renames the temp file onto the key's path and syncs the directory. A concurrent
// Delete may prune the freshly made parent directory, so a missing parent is retried once.
func (s *Store) commit(tmp, key string) error {
	dst := s.path(key)
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if err = os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			break
		}
		if err = os.Rename(tmp, dst); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return mapErr("put", key, err)
	}
	if s.sync {
		return s.syncDir(filepath.Dir(dst), key)
	}
	return nil
}

func (s *Store) syncDir(dir, key string) error {
	d, err := os.Open(dir)
	if err != nil {
		return mapErr("put", key, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("put %q: sync directory: %w", key, err)
	}
	return nil
}
