//go:build linux

package criu

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

// TestDumpLeavesRunningRestoreInPlace dumps a counter while it runs, shows it keeps counting,
// kills it and restores it in place: it continues from the dumped value, not from 0, and init
// answers on its (bind-mounted) unix socket again.
func TestDumpLeavesRunningRestoreInPlace(t *testing.T) {
	e := newEnv(t)
	sb := e.newSandbox(t, busyboxImage, counterScript, Options{TCPEstablished: true})
	before := sb.waitCount(t, "counter to start", func(n int) bool { return n > 5 })
	images := filepath.Join(t.TempDir(), "images")
	res, err := e.cp.Dump(e.ctx, sb.id, images)
	if err != nil {
		t.Fatal(err)
	}
	after := sb.count()
	t.Logf("dump: %s wall, CRIU frozen %s (freezing %s, memdump %s, memwrite %s), %d bytes, %d pages",
		res.Duration, res.Stats.Frozen, res.Stats.Freezing, res.Stats.MemDump, res.Stats.MemWrite, res.Size, res.Stats.PagesWritten)
	sb.waitCount(t, "counter to keep running after the dump", func(n int) bool { return n > after+20 })
	e.kill(t, sb)

	took := e.restore(t, sb, images)
	restored := sb.waitCount(t, "restored counter to write", func(n int) bool { return n >= before && n <= after+5 })
	sb.waitCount(t, "restored counter to keep counting", func(n int) bool { return n > restored+3 })
	e.waitInit(t, sb)
	t.Logf("restore in place: %s; counter dumped in [%d,%d], restored at %d", took, before, after, restored)
}

// TestRestoreNewID follows the L3 flow (pause, dump, copy the upper dir while frozen, resume)
// and restores into a second container made from the same image: the counter continues from
// the dumped value, in the new container's own cgroup, while the original keeps running.
func TestRestoreNewID(t *testing.T) {
	e := newEnv(t)
	src := e.newSandbox(t, busyboxImage, counterScript, Options{TCPEstablished: true})
	src.waitCount(t, "counter to start", func(n int) bool { return n > 5 })
	images := filepath.Join(t.TempDir(), "images")
	dst := e.newContainer(t, busyboxImage, counterScript, Options{TCPClose: true})
	if err := src.task.Pause(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cp.Dump(e.ctx, src.id, images); err != nil {
		t.Fatal(err)
	}
	dumped := src.count()
	copyTree(t, e.upperDir(t, src.id), e.upperDir(t, dst.id))
	if err := src.task.Resume(e.ctx); err != nil {
		t.Fatal(err)
	}
	took := e.restore(t, dst, images)
	n := dst.waitCount(t, "restored counter to continue", func(n int) bool { return n > dumped })
	if n > dumped+20 {
		t.Fatalf("restored counter at %d, dumped at %d", n, dumped)
	}
	src.waitCount(t, "original to keep counting", func(n int) bool { return n > dumped+5 })
	e.waitInit(t, dst)
	cg := cgroupOf(t, dst.task.Pid())
	if !strings.Contains(cg, dst.id) || strings.Contains(cg, src.id) {
		t.Fatalf("restored task is not in its own cgroup:\n%s", cg)
	}
	t.Logf("restore under new ID: %s; dumped at %d, restored counter at %d", took, dumped, n)
}

// TestRestoreRefusesSharedCgroup: a new container reusing the dumped one's cgroupsPath is
// refused before any task is created.
func TestRestoreRefusesSharedCgroup(t *testing.T) {
	e := newEnv(t)
	src := e.newSandbox(t, busyboxImage, "sleep 1000", Options{})
	images := filepath.Join(t.TempDir(), "images")
	res, err := e.cp.Dump(e.ctx, src.id, images)
	if err != nil {
		t.Fatal(err)
	}
	dst := e.newContainer(t, busyboxImage, "sleep 1000", Options{TCPClose: true}, oci.WithCgroup(res.Meta.CgroupsPath))
	_, err = e.cp.Restore(e.ctx, dst.id, images, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "own cgroup") {
		t.Fatalf("want FailedPrecondition naming the cgroup, got %v", err)
	}
	if _, err := dst.ctr.Task(e.ctx, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("refused restore left a task: %v", err)
	}
}

// lockScript holds an exclusive flock on /tmp/lock and marks /tmp/locked.
const lockScript = `exec python3 -c 'import fcntl,time; f=open("/tmp/lock","w"); fcntl.flock(f, fcntl.LOCK_EX); open("/tmp/locked","w").write("1"); time.sleep(1e6)'`

// TestFileLocksNeedConfig shows the CRIU configuration file named by the container's
// annotation is honoured: without file-locks CRIU refuses to dump a lock holder; with it the
// lock survives dump and restore (also into a new container whose own config enables it).
func TestFileLocksNeedConfig(t *testing.T) {
	e := newEnv(t)
	plain := e.newSandbox(t, pythonImage, lockScript, Options{})
	waitFile(t, plain, "/tmp/locked")
	if _, err := e.cp.Dump(e.ctx, plain.id, filepath.Join(t.TempDir(), "images")); err == nil {
		t.Fatal("dump of a flock holder without file-locks succeeded")
	} else {
		t.Logf("without file-locks: %v", err)
	}

	sb := e.newSandbox(t, pythonImage, lockScript, Options{FileLocks: true})
	waitFile(t, sb, "/tmp/locked")
	images := filepath.Join(t.TempDir(), "images")
	if _, err := e.cp.Dump(e.ctx, sb.id, images); err != nil {
		t.Fatal(err)
	}
	assertLocked(t, sb, "/tmp/lock")
	dst := e.newContainer(t, pythonImage, lockScript, Options{FileLocks: true, TCPClose: true})
	copyTree(t, e.upperDir(t, sb.id), e.upperDir(t, dst.id))
	e.kill(t, sb)
	e.restore(t, sb, images)
	assertLocked(t, sb, "/tmp/lock")
	e.restore(t, dst, images)
	assertLocked(t, dst, "/tmp/lock")

	// CRIU would restore into a container whose own config lacks file-locks without the lock,
	// silently: Restore refuses.
	bare := e.newContainer(t, pythonImage, lockScript, Options{TCPClose: true})
	copyTree(t, e.upperDir(t, sb.id), e.upperDir(t, bare.id))
	_, err := e.cp.Restore(e.ctx, bare.id, images, cio.LogFile(filepath.Join(bare.dir, "task.log")))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "file-locks") {
		t.Fatalf("want FailedPrecondition naming file-locks, got %v", err)
	}
}

// inotifyScript watches /tmp (on the overlay rootfs) through libc's inotify.
const inotifyScript = `exec python3 -c 'import ctypes,time; c=ctypes.CDLL(None); fd=c.inotify_init(); w=c.inotify_add_watch(fd, b"/tmp", 0x100); open("/tmp/watching","w").write(str(w)); time.sleep(1e6)'`

// TestInotifyOverlayIsFailedPrecondition: CRIU <= 4.2 cannot dump inotify watches on
// overlayfs; Dump refuses before CRIU runs and names the watching process.
func TestInotifyOverlayIsFailedPrecondition(t *testing.T) {
	e := newEnv(t)
	if v := e.cp.Status(e.ctx).Version; v >= inotifyFixVersion {
		testutil.SkipOrFail(t, "CRIU %d is assumed to dump inotify watches on overlayfs; nothing to refuse", v)
	}
	sb := e.newSandbox(t, pythonImage, inotifyScript, Options{})
	waitFile(t, sb, "/tmp/watching")
	images := filepath.Join(t.TempDir(), "images")
	_, err := e.cp.Dump(e.ctx, sb.id, images)
	if !errors.Is(err, ErrInotifyOverlay) || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "(python3, host pid") {
		t.Fatalf("want ErrInotifyOverlay + FailedPrecondition naming the python3 process, got %v", err)
	}
	if _, serr := os.Stat(filepath.Join(images, DumpLog)); serr == nil {
		t.Fatalf("CRIU ran although the pre-check refused the dump: %v", err)
	}
	t.Logf("inotify: %v", err)
	if st, err := sb.task.Status(e.ctx); err != nil || st.Status != "running" {
		t.Fatalf("task not running after the failed dump: %v %v", st, err)
	}
}

func waitFile(t *testing.T, sb *sandbox, name string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, 10*time.Millisecond, "file "+name, func() bool {
		_, err := os.Stat(sb.path(name))
		return err == nil
	})
}

// assertLocked fails unless someone holds a flock on name in sb.
func assertLocked(t *testing.T, sb *sandbox, name string) {
	t.Helper()
	f, err := os.Open(sb.path(name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("%s in %s is not locked (flock: %v)", name, sb.id, err)
	}
}

// TestHostConnectionBlocksDump: a host connection to init's socket open during the dump is
// an external unix socket, which CRIU refuses; closed, the dump passes.
func TestHostConnectionBlocksDump(t *testing.T) {
	e := newEnv(t)
	sb := e.newSandbox(t, busyboxImage, "sleep 1000", Options{})
	conn, err := net.Dial("unix", filepath.Join(sb.runDir, "init.sock"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.cp.Dump(e.ctx, sb.id, filepath.Join(t.TempDir(), "images"))
	conn.Close()
	if !errors.Is(err, ErrExternalUnixSocket) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("want ErrExternalUnixSocket + FailedPrecondition, got %v", err)
	}
	t.Logf("with a host connection: %v", err)
	testutil.WaitFor(t, 5*time.Second, 20*time.Millisecond, "dump after closing the connection", func() bool {
		_, err := e.cp.Dump(e.ctx, sb.id, filepath.Join(t.TempDir(), "images"))
		return err == nil
	})
}

// daemonScript double-forks a counter: the session leader exits, the counter is reparented
// to init in a session without a leader, so CRIU must fork a session helper from init.
const daemonScript = `setsid sh -c 'i=0; while true; do i=$((i+1)); printf "%011d\n" $i | dd of=/tmp/count bs=12 count=1 conv=notrunc 2>/dev/null; sleep 0.05; done & exit 0'`

// TestDaemonizedTreeNeedsParkedInit: with a daemonized process reparented to init, an init
// that still holds its listening socket is refused at dump time (CRIU 4.1.1 would dump it and
// then fail the restore with "Can't setns .../mnt"); parked, the tree dumps, restores under a
// new ID and continues, and the unparked init answers in both containers.
func TestDaemonizedTreeNeedsParkedInit(t *testing.T) {
	e := newEnv(t)
	if v := e.cp.Status(e.ctx).Version; v >= helperFixVersion {
		testutil.SkipOrFail(t, "CRIU %d forks helpers without CLONE_FS: nothing to refuse", v)
	}
	src := e.newSandbox(t, busyboxImage, daemonScript, Options{TCPEstablished: true})
	src.waitCount(t, "daemon to count", func(n int) bool { return n > 5 })
	_, err := e.cp.Dump(e.ctx, src.id, filepath.Join(t.TempDir(), "images"))
	if !errors.Is(err, ErrHelperWithUnixSocket) || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "process 1 (init") {
		t.Fatalf("dump with a listening init: want ErrHelperWithUnixSocket naming process 1, got %v", err)
	}
	t.Logf("listening init: %v", err)

	dst := e.newContainer(t, busyboxImage, daemonScript, Options{TCPClose: true})
	park(t, e, src)
	images := filepath.Join(t.TempDir(), "images")
	if err := src.task.Pause(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cp.Dump(e.ctx, src.id, images); err != nil {
		t.Fatal(err)
	}
	dumped := src.count()
	copyTree(t, e.upperDir(t, src.id), e.upperDir(t, dst.id))
	if err := src.task.Resume(e.ctx); err != nil {
		t.Fatal(err)
	}
	unpark(t, e, src)
	e.restore(t, dst, images)
	unpark(t, e, dst)
	n := dst.waitCount(t, "restored daemon to continue", func(n int) bool { return n > dumped })
	if n > dumped+20 {
		t.Fatalf("restored daemon at %d, dumped at %d", n, dumped)
	}
	src.waitCount(t, "original daemon to keep counting", func(n int) bool { return n > dumped+5 })
}

// park parks sb's init and waits until it holds no bound socket.
func park(t *testing.T, e *env, sb *sandbox) {
	t.Helper()
	if err := initproto.New(filepath.Join(sb.runDir, "init.sock")).Park(e.ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "init to close its listener", func() bool {
		socks, err := BoundUnixSockets(int(sb.task.Pid()))
		return err == nil && len(socks) == 0
	})
}

// unpark unparks sb's init and waits until it answers.
func unpark(t *testing.T, e *env, sb *sandbox) {
	t.Helper()
	if err := unix.Kill(int(sb.task.Pid()), initproto.UnparkSignal); err != nil {
		t.Fatal(err)
	}
	e.waitInit(t, sb)
}

// TestDumpTimeoutStopsCRIU bounds dumps of 50 MiB of heap below what one takes (measured
// first: a fraction of it), so they are stopped at different points (before CRIU runs, while
// it has the cgroup frozen, while it writes pages): each fails with DeadlineExceeded, no CRIU
// is left holding the images directory, the sandbox is not left frozen (it keeps counting),
// and a dump without the short bound then works: nothing of the stopped dump is in the way.
func TestDumpTimeoutStopsCRIU(t *testing.T) {
	e := newEnv(t)
	sb := e.newHeapSandbox(t)
	start := time.Now()
	if _, err := e.cp.Dump(e.ctx, sb.id, filepath.Join(t.TempDir(), "images")); err != nil {
		t.Fatalf("unbounded dump: %v", err)
	}
	took := time.Since(start)
	for _, bound := range []time.Duration{took / 10, took / 4, took / 2} {
		images := filepath.Join(t.TempDir(), "images")
		_, err := New(e.client, WithDumpTimeout(bound)).Dump(e.ctx, sb.id, images)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("dump bounded to %s: %v, want DeadlineExceeded", bound, err)
		}
		t.Logf("dump bounded to %s: %v", bound, err)
		testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "no CRIU holding the images directory", func() bool {
			return len(dumpersOf(images)) == 0
		})
		n := sb.count()
		sb.waitCount(t, "counter to keep running after the stopped dump", func(m int) bool { return m > n+3 })
	}
	if _, err := e.cp.Dump(e.ctx, sb.id, filepath.Join(t.TempDir(), "images")); err != nil {
		t.Fatalf("dump after the stopped ones: %v", err)
	}
}
