package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// createNetNS creates a new network namespace (or takes the existing one from names, a
// /proc/PID/ns/net) and pins it by bind-mounting it onto path (the way `ip netns add` does).
// IPv6 is disabled inside it: the firewall drops all sandbox IPv6, and without addresses a
// sandbox cannot even try link-local IPv6 to the host.
func createNetNS(path, from string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("netns %s: %w", path, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	if from != "" {
		go func() { errc <- pinNetNS(from, path) }()
	} else {
		go func() { errc <- pinNewNetNS(path) }()
	}
	if err := <-errc; err != nil {
		_ = removeNetNS(path)
		return err
	}
	return nil
}

// pinNewNetNS runs on its own goroutine: it moves its locked OS thread into a new network
// namespace and never unlocks it, so the Go runtime discards the thread when it returns.
func pinNewNetNS(path string) error {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare network namespace: %w", err)
	}
	self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
	if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount netns onto %s: %w", path, err)
	}
	return disableIPv6()
}

// pinNetNS bind-mounts the existing namespace from onto path and, on its own goroutine's
// locked OS thread (never unlocked, so discarded), joins it to disable IPv6.
func pinNetNS(from, path string) error {
	runtime.LockOSThread()
	if err := unix.Mount(from, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount netns %s onto %s: %w", from, path, err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("join netns %s: %w", path, err)
	}
	return disableIPv6()
}

// disableIPv6 turns IPv6 off in the calling thread's network namespace (/proc/sys/net follows
// the thread's namespace), for interfaces present and future.
func disableIPv6() error {
	for _, k := range []string{"all", "default"} {
		p := "/proc/sys/net/ipv6/conf/" + k + "/disable_ipv6"
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("disable ipv6 in netns: %w", err)
		}
	}
	return nil
}

// shareNetNSDir makes dir a shared mount point of its own, as `ip netns add` does the first
// time it runs: namespaces pinned there then show in other mount namespaces, and a later
// `ip netns add` finds the mount point in place. Without it, that first `ip netns add`
// bind-mounts the directory over itself, hiding the namespaces DeltaBox had pinned there
// under a copy, and their teardown fails with EBUSY (the hidden mounts keep the files busy).
// A directory that is not a mount point yet but already holds pinned namespaces (from a
// daemon before this one) is left as it is, for the same reason.
func shareNetNSDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) { // EINVAL: not a mount point
		return wrapShare(dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read netns dir: %w", err)
	}
	if len(entries) > 0 {
		return nil
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return wrapShare(dir, err)
	}
	return wrapShare(dir, unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""))
}

func wrapShare(dir string, err error) error {
	if err != nil {
		return fmt.Errorf("make %s a shared mount point: %w", dir, err)
	}
	return nil
}

// removeNetNS unmounts and removes a pinned namespace; a missing one is fine. The namespace
// (and the sandbox end of its veth, which takes the host end with it) goes away once no
// process is left in it.
func removeNetNS(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}
