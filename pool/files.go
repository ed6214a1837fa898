package pool

import (
	"archive/tar"
	"context"
	"fmt"
	"io"

	"github.com/deltabox/deltabox/internal/rootfs"
)

// root opens a leased sandbox's root filesystem as its init sees it (/proc/PID/root), for
// symlink-safe access from the host.
func (m *Manager) root(id string) (*rootfs.Root, error) {
	sb, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	return rootfs.Open(fmt.Sprintf("/proc/%d/root", sb.InitPid))
}

// CopyTo extracts a tar stream into a leased sandbox at dest (docker-cp semantics).
func (m *Manager) CopyTo(ctx context.Context, id, dest string, r io.Reader) (rootfs.ExtractResult, error) {
	root, err := m.root(id)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	defer root.Close()
	return root.Extract(dest, tar.NewReader(r), rootfs.ExtractOptions{Chown: true})
}

// CopyFrom writes src of a leased sandbox to w as a tar stream.
func (m *Manager) CopyFrom(ctx context.Context, id, src string, w io.Writer) error {
	rel, err := rootfs.CleanPath(src)
	if err != nil {
		return err
	}
	root, err := m.root(id)
	if err != nil {
		return err
	}
	defer root.Close()
	if _, err := root.Lstat(rel); err != nil {
		return err
	}
	return root.Archive(rel, w)
}

// StatPath checks that src exists in a leased sandbox (so errors come before a stream starts).
func (m *Manager) StatPath(id, src string) error {
	rel, err := rootfs.CleanPath(src)
	if err != nil {
		return err
	}
	root, err := m.root(id)
	if err != nil {
		return err
	}
	defer root.Close()
	_, err = root.Lstat(rel)
	return err
}
