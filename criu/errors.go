package criu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ErrInotifyOverlay is wrapped (together with errdefs.ErrFailedPrecondition) into the error
// of a dump that failed because a process holds inotify watches on overlayfs, which CRIU up to
// 4.2 cannot dump (it cannot reopen the watched inode through an overlayfs file handle).
var ErrInotifyOverlay = errors.New("processes with inotify watches on overlayfs cannot be checkpointed by CRIU <= 4.2")

// ErrExternalUnixSocket is wrapped (with errdefs.ErrFailedPrecondition) into the error of a
// dump that failed because a sandbox process has a unix connection to a peer outside the
// sandbox, typically a host client of the init socket left open.
var ErrExternalUnixSocket = errors.New("a unix socket connected from outside the sandbox (e.g. a host client of the init socket) is open; close it before the dump")

// ErrUserNamespace is wrapped (with errdefs.ErrFailedPrecondition) into the error of an L3
// dump or restore of a container in a user namespace. The sandbox's network namespace must
// belong to its user namespace (else CRIU refuses the dump), and CRIU 4.1 restores a dumped
// user namespace by creating a new one first and then entering the external network namespace
// from inside it, which the kernel refuses (EPERM: the namespace belongs to another user
// namespace); joining the existing user namespace instead (runc's join-ns) comes after that step.
var ErrUserNamespace = errors.New("the sandbox runs in a user namespace, and CRIU 4.1 cannot restore a container whose network namespace belongs to its user namespace; L3 checkpoints, snapshots, restores and forks need a pool created with no_user_namespace (deltabox pool create --no-userns)")

// RefuseUserNamespace returns ErrUserNamespace (FailedPrecondition) for a spec with a user
// namespace, naming what was asked.
func RefuseUserNamespace(what string, spec *specs.Spec) error {
	if spec == nil || spec.Linux == nil {
		return nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.UserNamespace {
			return fmt.Errorf("%s: %w: %w", what, ErrUserNamespace, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// Log files CRIU writes into its work directory (runc's names).
const (
	DumpLog    = "dump.log"
	RestoreLog = "restore.log"
)

// maxErrorLines bounds the CRIU log lines quoted in an error.
const maxErrorLines = 4

// dumpError explains a failed dump with the error lines of CRIU's dump.log in dir.
func dumpError(id, dir string, err error) error {
	logPath := filepath.Join(dir, DumpLog)
	lines := criuErrorLines(logPath)
	if mentionsInotify(lines) {
		return fmt.Errorf("dump container %s: %w (%s; log %s): %w", id, ErrInotifyOverlay, strings.Join(lines, "; "), logPath, errdefs.ErrFailedPrecondition)
	}
	if mentionsExternalUnix(lines) {
		return fmt.Errorf("dump container %s: %w (%s; log %s): %w", id, ErrExternalUnixSocket, strings.Join(lines, "; "), logPath, errdefs.ErrFailedPrecondition)
	}
	if len(lines) == 0 {
		return fmt.Errorf("dump container %s (no CRIU errors in %s): %w", id, logPath, err)
	}
	return fmt.Errorf("dump container %s: CRIU: %s (log %s): %w", id, strings.Join(lines, "; "), logPath, err)
}

// restoreError explains a failed restore with the error lines of CRIU's restore.log.
func restoreError(id, workDir string, err error) error {
	logPath := filepath.Join(workDir, RestoreLog)
	lines := criuErrorLines(logPath)
	if len(lines) == 0 {
		return fmt.Errorf("restore container %s (no CRIU errors in %s): %w", id, logPath, err)
	}
	return fmt.Errorf("restore container %s: CRIU: %s (log %s): %w", id, strings.Join(lines, "; "), logPath, err)
}

// criuErrorLines returns the first few "Error (file:line): ..." lines of a CRIU log.
func criuErrorLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && len(out) < maxErrorLines {
		line := sc.Text()
		if i := strings.Index(line, "Error ("); i >= 0 && !benign(line) {
			out = append(out, strings.TrimSpace(line[i:]))
		}
	}
	return out
}

func mentionsInotify(lines []string) bool {
	for _, l := range lines {
		l = strings.ToLower(l)
		if strings.Contains(l, "inotify") || strings.Contains(l, "fsnotify") {
			return true
		}
	}
	return false
}

// benign reports CRIU error lines that do not make a dump fail: CRIU cannot raise its own
// RLIMIT_NOFILE inside the shim's limits and says so as an "Error".
func benign(line string) bool {
	return strings.Contains(line, "Can't setup RLIMIT_NOFILE")
}

// mentionsExternalUnix matches CRIU's "unix: Unix socket N not found" (a peer outside the
// dumped tree) and its "External socket" refusals.
func mentionsExternalUnix(lines []string) bool {
	for _, l := range lines {
		if strings.Contains(l, "sk-unix.c") && (strings.Contains(l, "not found") || strings.Contains(l, "xternal")) {
			return true
		}
	}
	return false
}
