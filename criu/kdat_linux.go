//go:build linux

package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// KdatCache is where CRIU (built with its default RUNDIR) keeps what it learned about the
// kernel, and reads it at every start.
const KdatCache = "/run/criu.kdat"

// maxKdat bounds the cache file read back (CRIU 4.1's struct kerndat_s is under 1 KiB).
const maxKdat = 64 << 10

// PrimeKdatCache makes sure the CRIU at criuPath finds its kernel-features cache. CRIU probes
// the kernel at every start (features, the vDSO, iptables -L to load modules: 30 ms of a
// 128 ms restore here) unless KdatCache holds the result, and it writes that file only where
// /run is a tmpfs, so that a reboot into another kernel drops it. On a node whose /run is not
// a tmpfs (no systemd) no CRIU run is ever cached: PrimeKdatCache then runs `criu check` in a
// mount namespace of its own with a tmpfs on /run, where CRIU writes the cache, and copies the
// file to KdatCache. CRIU loads it from any filesystem; it drops it itself when another CRIU
// build finds it (the file carries the build's magic). What the file cannot tell is a kernel
// booted since: the daemon primes it again at every start, before its first dump or restore.
// It returns false when /run is a tmpfs (CRIU caches there itself).
func PrimeKdatCache(ctx context.Context, criuPath string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(KdatCache), &st); err != nil {
		return false, fmt.Errorf("criu kdat cache: %w", err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return false, nil
	}
	path, err := exec.LookPath(criuPath)
	if err != nil {
		return false, fmt.Errorf("criu kdat cache: %w", err)
	}
	data, err := probeKdat(ctx, path)
	if err != nil {
		return false, err
	}
	return true, writeFileAtomic(KdatCache, data, 0o600)
}

// probeKdat runs `criu check` in a new mount namespace with a private tmpfs on /run and
// returns the cache CRIU wrote there. A shell mounts the tmpfs (the namespace is unshared by
// the Go runtime before exec, which also makes the new namespace's mounts private, so nothing
// propagates to the node) and reads the file back before the namespace goes away with it.
func probeKdat(ctx context.Context, criuPath string) ([]byte, error) {
	const script = `mount -t tmpfs -o mode=0700,size=1m deltabox-criu-kdat /run || exit 97
"$1" check >/dev/null 2>&1
exec cat /run/criu.kdat`
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script, "sh", criuPath)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 97 {
		return nil, fmt.Errorf("criu kdat cache: mount a tmpfs on /run in a private mount namespace: %s", bytes.TrimSpace(errOut.Bytes()))
	}
	if err != nil {
		return nil, fmt.Errorf("criu kdat cache: `%s check` wrote no cache: %v: %s", criuPath, err, bytes.TrimSpace(errOut.Bytes()))
	}
	if out.Len() == 0 || out.Len() > maxKdat {
		return nil, fmt.Errorf("criu kdat cache: `%s check` wrote a cache of %d bytes", criuPath, out.Len())
	}
	return out.Bytes(), nil
}
