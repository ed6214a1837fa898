package pool

import (
	"os/exec"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestInitRefHoldsTheProcessNotThePid: a ref refuses a pid outside the sandbox's cgroup,
// answers the peer check only for its own pid, and once the process exits every use fails
// with failed_precondition at once (the watcher fires; a zombie does not pass for alive).
func TestInitRefHoldsTheProcessNotThePid(t *testing.T) {
	_, f := testCgroup(t)
	outside := exec.Command("sleep", "100")
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = outside.Process.Kill(); _ = outside.Wait() }()
	if _, err := openInitRef(uint32(outside.Process.Pid), f); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("ref of a pid outside the cgroup: %v, want failed precondition", err)
	}
	init := startIn(t, f.dir)
	ref, err := openInitRef(uint32(init.Process.Pid), f)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.retire()
	go ref.watch()
	if err := ref.checkPeer(int32(init.Process.Pid), 0, 0); err != nil {
		t.Fatalf("peer check of the init: %v", err)
	}
	if err := ref.checkPeer(int32(outside.Process.Pid), 0, 0); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("peer check of another process: %v, want permission denied", err)
	}
	root, err := ref.openRoot()
	if err != nil {
		t.Fatal(err)
	}
	root.Close()
	_ = init.Process.Kill() // not reaped yet: a zombie
	select {
	case <-ref.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher did not see the exit")
	}
	if err := ref.usable(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("usable after exit: %v", err)
	}
	if _, err := ref.openRoot(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("root after exit: %v", err)
	}
	if err := ref.checkPeer(int32(init.Process.Pid), 0, 0); err == nil {
		t.Fatal("peer check passed for an exited init")
	}
}
