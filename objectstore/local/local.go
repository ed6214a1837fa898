// Package local is the embedded objectstore backend: objects are files under a root
// directory (<root>/objects/<key>), written atomically through <root>/tmp (temp file, fsync,
// rename, fsync of the directory). It owns that directory tree and nothing else; it must not
// follow keys outside it (keys are validated before they become paths) and must not import
// the objectstore package (objectstore imports it).
//
// A key cannot be both an object and the parent of another ("a" and "a/b"): the filesystem
// forbids it, and Put reports errdefs.ErrConflict.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore/internal/base"
)

// Store keeps objects as files under a root directory. It is safe for concurrent use.
type Store struct {
	root    string
	objects string
	tmp     string
	sync    bool
	perm    fs.FileMode
}

// Option configures a Store.
type Option func(*Store)

// WithSync turns fsync of objects and directories on Put on or off (default on). Off is for
// throwaway stores only: a crash can then leave an empty or partial object visible.
func WithSync(enabled bool) Option { return func(s *Store) { s.sync = enabled } }

// WithFileMode sets the permission bits of stored objects (default 0o600).
func WithFileMode(perm fs.FileMode) Option { return func(s *Store) { s.perm = perm.Perm() } }

// New opens (creating if needed) a store rooted at the absolute directory root.
func New(root string, opts ...Option) (*Store, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("local object store root %q is not absolute: %w", root, errdefs.ErrInvalidArgument)
	}
	root = filepath.Clean(root)
	s := &Store{root: root, objects: filepath.Join(root, "objects"), tmp: filepath.Join(root, "tmp"), sync: true, perm: 0o600}
	for _, o := range opts {
		o(s)
	}
	for _, dir := range []string{s.objects, s.tmp} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create local object store %s: %w", dir, err)
		}
	}
	return s, nil
}

// Root returns the store's root directory.
func (s *Store) Root() string { return s.root }

// path turns a validated key into its file path.
func (s *Store) path(key string) string {
	return filepath.Join(s.objects, filepath.FromSlash(key))
}

// Get opens the object, or the part rng selects.
func (s *Store) Get(ctx context.Context, key string, rng base.Range) (io.ReadCloser, error) {
	if err := base.ValidateKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	f, size, err := s.open(key)
	if err != nil {
		return nil, err
	}
	r, err := rangeReader(f, size, rng)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("get %q: %w", key, err)
	}
	return base.ReadCloser{Reader: base.ContextReader(ctx, r), Closer: f}, nil
}

// open opens the regular file of key (never through a symlink) and returns its size.
func (s *Store) open(key string) (*os.File, int64, error) {
	f, err := os.OpenFile(s.path(key), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, mapErr("get", key, err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		f.Close()
		return nil, 0, mapErr("get", key, err)
	}
	return f, st.Size(), nil
}

func rangeReader(f *os.File, size int64, rng base.Range) (io.Reader, error) {
	if err := rng.Check(size); err != nil {
		return nil, err
	}
	n := size - rng.Offset
	if rng.Length > 0 && rng.Length < n {
		n = rng.Length
	}
	return io.NewSectionReader(f, rng.Offset, n), nil
}

// Stat returns the object's size and modification time.
func (s *Store) Stat(ctx context.Context, key string) (base.Info, error) {
	if err := base.ValidateKey(key); err != nil {
		return base.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return base.Info{}, fmt.Errorf("stat %q: %w", key, err)
	}
	st, err := os.Lstat(s.path(key))
	if err == nil && !st.Mode().IsRegular() {
		err = fs.ErrNotExist
	}
	if err != nil {
		return base.Info{}, mapErr("stat", key, err)
	}
	return base.Info{Key: key, Size: st.Size(), ModTime: st.ModTime()}, nil
}

// Delete removes the object and the directories it leaves empty.
func (s *Store) Delete(ctx context.Context, key string) error {
	if _, err := s.Stat(ctx, key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := os.Remove(s.path(key)); err != nil {
		return mapErr("delete", key, err)
	}
	s.pruneDirs(filepath.Dir(s.path(key)))
	return nil
}

// pruneDirs removes dir and its parents up to the objects directory while they are empty.
func (s *Store) pruneDirs(dir string) {
	for dir != s.objects && strings.HasPrefix(dir, s.objects+string(filepath.Separator)) {
		if os.Remove(dir) != nil {
			return
		}
		dir = filepath.Dir(dir)
	}
}

// mapErr translates filesystem errors into errdefs classes.
func mapErr(op, key string, err error) error {
	switch {
	case op == "put" && errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s %q: a parent of the key is an object: %w: %w", op, key, errdefs.ErrConflict, err)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("%s %q: object not found: %w", op, key, errdefs.ErrNotFound)
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EEXIST), errors.Is(err, syscall.ENOTEMPTY):
		return fmt.Errorf("%s %q: key collides with a key prefix (\"a\" and \"a/b\"): %w: %w", op, key, errdefs.ErrConflict, err)
	}
	return fmt.Errorf("%s %q: %w", op, key, err)
}
