//go:build linux

package criu

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

const mainThreadNetNSEnv = "DELTABOX_CRIU_TEST_MAIN_THREAD_NETNS"

// init runs the helper of TestPathUnixSocketsMainThreadElsewhere: during init the main
// goroutine is on the process's first thread, the one /proc/self describes.
func init() {
	if os.Getenv(mainThreadNetNSEnv) == "" {
		return
	}
	runtime.LockOSThread()
	os.Exit(mainThreadNetNSHelper(os.Getenv(mainThreadNetNSEnv)))
}

// mainThreadNetNSHelper holds a listener and an accepted connection on path, moves its
// first thread into a new network namespace (as a goroutine pinning a sandbox's namespace
// leaves it when it ran there) and prints what PathUnixSockets finds of its own sockets.
func mainThreadNetNSHelper(path string) int {
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := l.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		fmt.Fprintln(os.Stderr, "unshare:", err)
		return 1
	}
	socks, err := PathUnixSockets(os.Getpid())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(strings.Join(socks, "\n"))
	a.Close()
	c.Close()
	l.Close()
	return 0
}

// TestPathUnixSocketsMainThreadElsewhere: the daemon's first thread was left in a sandbox's
// network namespace; PathUnixSockets must still find the listener and the connection it
// accepted, both in the namespace the daemon runs in (before, it read /proc/self/net/unix,
// the first thread's table, found neither, and CRIU then failed the dump of an init that
// still held a host connection).
func TestPathUnixSocketsMainThreadElsewhere(t *testing.T) {
	testutil.RequiresRoot(t)
	path := filepath.Join(t.TempDir(), "s.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mainThreadNetNSEnv+"="+path)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("helper: %v: %s", err, stderr)
	}
	got := strings.Split(string(out), "\n")
	if len(got) != 2 || got[0] != path || got[1] != path {
		t.Fatalf("PathUnixSockets found %q, want the listener and the accepted connection on %s", got, path)
	}
}
