package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/deltabox/deltabox/objectstore/internal/base"
)

// List walks the directory that holds every key with the prefix and returns the matching
// objects sorted by key.
func (s *Store) List(ctx context.Context, prefix string) ([]base.Info, error) {
	if err := base.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	var out []base.Info
	err := filepath.WalkDir(s.walkRoot(prefix), func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil // no such directory, or removed while walking
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, ok, err := s.entry(p, d, prefix)
		if ok {
			out = append(out, info)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	slices.SortFunc(out, func(a, b base.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// walkRoot is the deepest directory containing every key that starts with prefix.
func (s *Store) walkRoot(prefix string) string {
	dir := prefix
	if !strings.HasSuffix(prefix, "/") {
		dir = path.Dir(prefix)
	}
	return filepath.Join(s.objects, filepath.FromSlash(dir))
}

// entry returns the Info of a walked path when it is a regular file whose key has prefix.
func (s *Store) entry(p string, d fs.DirEntry, prefix string) (base.Info, bool, error) {
	if !d.Type().IsRegular() {
		return base.Info{}, false, nil
	}
	rel, err := filepath.Rel(s.objects, p)
	if err != nil {
		return base.Info{}, false, err
	}
	key := filepath.ToSlash(rel)
	if !strings.HasPrefix(key, prefix) {
		return base.Info{}, false, nil
	}
	st, err := d.Info()
	if errors.Is(err, fs.ErrNotExist) { // deleted while walking
		return base.Info{}, false, nil
	}
	if err != nil {
		return base.Info{}, false, err
	}
	return base.Info{Key: key, Size: st.Size(), ModTime: st.ModTime()}, true, nil
}
