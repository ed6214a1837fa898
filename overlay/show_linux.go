//go:build linux

package overlay

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/containerd/errdefs"
)

// FileInfo describes one path of the merged tree as of a checkpoint.
type FileInfo struct {
	Path   string `json:"path"`
	Kind   Kind   `json:"kind"`
	Mode   uint32 `json:"mode"`
	Size   int64  `json:"size"`
	Target string `json:"target,omitempty"` // symlink target
}

// CleanPath turns a path of the sandbox ("/etc/hosts", "etc/hosts") into the store's form
// ("etc/hosts"; "" is the root); ".." that would leave the root is refused.
func CleanPath(p string) (string, error) {
	c := path.Clean("/" + p)
	if strings.Contains(p, "\x00") {
		return "", fmt.Errorf("path %q: %w", p, errdefs.ErrInvalidArgument)
	}
	return strings.TrimPrefix(c, "/"), nil
}

// ReadFile writes the content of path p (a regular file) as of checkpoint id to w and
// describes it; for other kinds it writes nothing. The merged view is resolved as overlayfs
// would (upper state over the lower layers), never following a symlink: a path through a
// symlink does not exist. Content from the checkpoint's packs is checked against its digest.
func (s *Store) ReadFile(ctx context.Context, id, p string, w io.Writer) (FileInfo, error) {
	rel, err := CleanPath(p)
	if err != nil {
		return FileInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pos, err := s.lookup(id)
	if err != nil {
		return FileInfo{}, err
	}
	v, err := newView(s.stateAt(pos), s.chain[pos].Lower)
	if err != nil {
		return FileInfo{}, err
	}
	defer v.close()
	e, err := v.lookup(rel)
	if err != nil {
		return FileInfo{}, err
	}
	if e == nil {
		return FileInfo{}, fmt.Errorf("%s in checkpoint %s: %w", path.Join("/", rel), id, errdefs.ErrNotFound)
	}
	info := FileInfo{Path: path.Join("/", rel), Kind: e.Kind, Mode: e.Mode, Size: e.Size, Target: e.Target}
	if e.Kind != KindFile || e.Size == 0 {
		return info, nil
	}
	src, err := openSource(s, v, e)
	if err != nil {
		return info, err
	}
	f := s.packs[e.ckpt] // the pack's own file (never wrapped: that would close its fd)
	if src.owned {       // a lower file opened for this read
		f = os.NewFile(uintptr(src.fd), e.Path)
		defer f.Close()
	}
	_, err = io.Copy(w, io.NewSectionReader(f, src.off, e.Size))
	return info, err
}
