package criu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
)

// ErrInotifyOverlay is wrapped (together with errdefs.ErrFailedPrecondition) into the error
// of a dump that failed because a process holds inotify watches on overlayfs, which CRIU up to
// 4.2 cannot dump (it cannot reopen the watched inode through an overlayfs file handle).
var ErrInotifyOverlay = errors.New("processes with inotify watches on overlayfs cannot be checkpointed by CRIU <= 4.2")

// ErrExternalUnixSocket is wrapped (with errdefs.ErrFailedPrecondition) into the error of a
// dump that failed because a sandbox process has a unix connection to a peer outside the
// sandbox, typically a host client of the init socket left open.
var ErrExternalUnixSocket = errors.New("a unix socket connected from outside the sandbox (e.g. a host client of the init socket) is open; close it before the dump")

// ErrRestoredUserNS is wrapped (with errdefs.ErrFailedPrecondition) into the error of a dump
// of a user-namespaced sandbox whose init CRIU restored and which did not execute itself
// again (an init from before pool/initd/reexec_linux.go). CRIU checks, from inside the
// sandbox's user namespace, that it may open the init's namespaces; a process CRIU restored
// keeps the memory descriptor of the CRIU that made it, which belongs to the host's user
// namespace, and the init is not dumpable, so the check is refused.
var ErrRestoredUserNS = errors.New("the sandbox's init was restored by CRIU in a user namespace and did not execute itself again (an older init), so CRIU cannot dump it; release the sandbox")

// mentionsRestoredUserNS reports whether CRIU's errors are its user namespace check failing
// on a namespace file it may not open.
func mentionsRestoredUserNS(lines []string) bool {
	for _, l := range lines {
		if strings.Contains(l, "doesn't belong to the target user namespace") {
			return true
		}
	}
	return false
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
	if mentionsRestoredUserNS(lines) {
		return fmt.Errorf("dump container %s: %w (%s; log %s): %w", id, ErrRestoredUserNS, strings.Join(lines, "; "), logPath, errdefs.ErrFailedPrecondition)
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
