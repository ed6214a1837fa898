package integration

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dialInitSocket connects to a sandbox's init socket from the host as the daemon does
// (through an O_PATH fd: the path is longer than a socket address allows) and sends nothing.
func dialInitSocket(t *testing.T, path string) net.Conn {
	t.Helper()
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	conn, err := net.Dial("unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestL3DumpWaitsForAHostConnectionToTheInit: a host connection to the init is open when an
// L3 checkpoint starts (as an exec's is for a moment after the exec returns). The accepted
// socket belongs to the host's network namespace, so the sandbox's socket table does not
// show it; the dump must still wait until the init closed it, not fail with "connected from
// outside the sandbox".
func TestL3DumpWaitsForAHostConnectionToTheInit(t *testing.T) {
	d := startDaemon(t)
	d.createPool("l3conn", busyboxImage, 1)
	l := d.lease("l3conn")
	conn := dialInitSocket(t, filepath.Join(d.runDir(l.Container), "init.sock"))
	time.Sleep(100 * time.Millisecond) // accepted by the init
	go func() {
		time.Sleep(500 * time.Millisecond)
		conn.Close()
	}()
	start := time.Now()
	out, errOut, code := d.cliRaw("checkpoint", "create", l.ID, "--level", "l3")
	if code != 0 {
		t.Fatalf("L3 checkpoint with a host connection to the init open: %s %s", out, errOut)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("the dump did not wait for the connection to close (took %s)", took)
	}
	d.cli("exec", l.ID, "--", "true")
}

// TestL3DumpRightAfterExec: an L3 checkpoint taken the moment an exec returns (its
// connection to the init may still be closing inside the init) never fails with a unix
// socket connected from outside the sandbox. 20 rounds.
func TestL3DumpRightAfterExec(t *testing.T) {
	d := startDaemon(t)
	d.createPool("l3exec", busyboxImage, 1)
	id := d.lease("l3exec").ID
	for i := range 20 {
		d.cli("exec", id, "--", "sh", "-c", "echo "+strings.Repeat("x", 1000))
		out, errOut, code := d.cliRaw("checkpoint", "create", id, "--level", "l3")
		if code != 0 {
			if strings.Contains(errOut, "outside the sandbox") {
				t.Fatalf("round %d: the dump raced a closing host connection to the init: %s", i, errOut)
			}
			t.Fatalf("round %d: L3 checkpoint: %s %s", i, out, errOut)
		}
	}
	d.cli("exec", id, "--", "true")
}
