package pool

import (
	"archive/tar"
	"context"
	"io"
	"path"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/pool/initproto"
)

// root opens a leased sandbox's root filesystem as its init sees it, for symlink-safe
// access from the host: through the root fd taken when the init started (Sandbox.OpenRoot),
// never /proc/PID/root by number, which names another process once the pid is reused.
func (m *Manager) root(id string) (*rootfs.Root, error) {
	sb, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	f, err := sb.OpenRoot()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return rootfs.Open(FDPath(f), rootfs.WithIDMap(sb.Isolation.IDMapping.rootfsMap()))
}

// CopyTo extracts a tar stream into a leased sandbox at dest (docker-cp semantics); with
// parents, dest's missing parent directories are made first (0755, through the sandbox's
// root like everything else here).
func (m *Manager) CopyTo(ctx context.Context, id, dest string, r io.Reader, parents bool) (rootfs.ExtractResult, error) {
	root, err := m.root(id)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	defer root.Close()
	rel, err := resolveDest(root, dest)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	if dir := path.Dir(rel); parents && dir != "." {
		if _, err := root.MkdirAll(dir, 0o755); err != nil {
			return rootfs.ExtractResult{}, err
		}
	}
	return root.Extract(rel, tar.NewReader(r), rootfs.ExtractOptions{Chown: true})
}

// resolveDest resolves a copy's destination inside the sandbox's root, following its
// symlinks there (docker cp's semantics): the last one too when it leads to a directory,
// which the copy then goes into.
func resolveDest(root *rootfs.Root, dest string) (string, error) {
	rel, err := rootfs.CleanPath(dest)
	if err != nil {
		return "", err
	}
	if full, err := root.Resolve(rel, true); err == nil {
		if st, err := root.Lstat(full); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return full, nil
		}
	}
	return root.Resolve(rel, false)
}

// CopyFrom writes src of a leased sandbox to w as a tar stream.
func (m *Manager) CopyFrom(ctx context.Context, id, src string, w io.Writer) error {
	root, rel, err := m.openPath(id, src)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.Archive(rel, w)
}

// StatPath checks that src exists in a leased sandbox (so errors come before a stream starts).
func (m *Manager) StatPath(id, src string) error {
	root, _, err := m.openPath(id, src)
	if err == nil {
		root.Close()
	}
	return err
}

// openPath opens a sandbox's root and checks that src exists in it: symlinks on the way are
// followed within the root (rootfs.Resolve), a final one is not.
func (m *Manager) openPath(id, src string) (*rootfs.Root, string, error) {
	rel, err := rootfs.CleanPath(src)
	if err != nil {
		return nil, "", err
	}
	root, err := m.root(id)
	if err != nil {
		return nil, "", err
	}
	if rel, err = root.Resolve(rel, false); err != nil { // the sandbox's symlinks, within its root
		root.Close()
		return nil, "", err
	}
	if _, err := root.Lstat(rel); err != nil {
		root.Close()
		return nil, "", err
	}
	return root, rel, nil
}

// Root opens a leased sandbox's root filesystem for symlink-safe access from the host (see
// root); the caller closes it.
func (m *Manager) Root(id string) (*rootfs.Root, error) { return m.root(id) }

// KillTag kills (SIGKILL) the processes of a leased sandbox's execs tagged tag, and their
// descendants, through the sandbox's init.
func (m *Manager) KillTag(ctx context.Context, id, tag string) (int, error) {
	sb, err := m.Get(id)
	if err != nil {
		return 0, err
	}
	if err := sb.Usable(); err != nil {
		return 0, err
	}
	resp, err := sb.initc.Kill(ctx, initproto.KillRequest{Tag: tag})
	return len(resp.Killed), err
}

// SignalTag sends sig ("SIGTERM", "SIGINT", ...; "SIGKILL" is KillTag) once to the processes
// of a leased sandbox's execs tagged tag and their descendants, without waiting for them.
func (m *Manager) SignalTag(ctx context.Context, id, tag, sig string) (int, error) {
	sb, err := m.Get(id)
	if err != nil {
		return 0, err
	}
	if err := sb.Usable(); err != nil {
		return 0, err
	}
	resp, err := sb.initc.Kill(ctx, initproto.KillRequest{Tag: tag, Signal: sig})
	return len(resp.Killed), err
}
