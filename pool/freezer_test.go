package pool

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// testCgroup makes a cgroup with a freezer for the test and returns its path and freezer.
func testCgroup(t *testing.T) (string, Freezer) {
	t.Helper()
	testutil.RequiresRoot(t)
	path := fmt.Sprintf("/deltabox-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	f := NewFreezer(path)
	if err := os.Mkdir(f.dir, 0o755); err != nil {
		testutil.SkipOrFail(t, "cannot make a cgroup here: %v", err)
	}
	t.Cleanup(func() {
		_ = f.Thaw()
		_ = os.Remove(filepath.Join(f.dir, "child"))
		_ = os.Remove(f.dir)
	})
	return path, f
}

// startIn starts sleep in the cgroup directory dir.
func startIn(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestKillAllButKeepsOnlyTheInit: release kills through the cgroup, child cgroups included,
// and leaves the init (and processes outside the cgroup) alone.
func TestKillAllButKeepsOnlyTheInit(t *testing.T) {
	_, f := testCgroup(t)
	init := startIn(t, f.dir)
	victim := startIn(t, f.dir)
	if err := os.Mkdir(filepath.Join(f.dir, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	nested := startIn(t, filepath.Join(f.dir, "child"))
	outside := exec.Command("sleep", "100")
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = outside.Process.Kill(); _ = outside.Wait() }()
	waits := map[string]chan error{}
	for name, c := range map[string]*exec.Cmd{"victim": victim, "nested": nested} {
		ch := make(chan error, 1)
		go func() { ch <- c.Wait() }()
		waits[name] = ch
	}
	killed, err := f.KillAllBut(context.Background(), init.Process.Pid, 5*time.Second)
	if err != nil || killed != 2 {
		t.Fatalf("KillAllBut = %d, %v; want 2 killed", killed, err)
	}
	for name, ch := range waits {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s survived", name)
		}
	}
	for name, c := range map[string]*exec.Cmd{"init": init, "outside": outside} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("%s was killed: %v", name, err)
		}
	}
	if member, err := f.member(outside.Process.Pid); err != nil || member {
		t.Fatalf("a process outside the cgroup counts as a member (%v)", err)
	}
}

// TestKillSignalsOnlyMembers: Freezer.Kill leaves a pid that is not (or no longer) in the
// cgroup alone.
func TestKillSignalsOnlyMembers(t *testing.T) {
	_, f := testCgroup(t)
	member := startIn(t, f.dir)
	outside := exec.Command("sleep", "100")
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = outside.Process.Kill(); _ = outside.Wait() }()
	if n := f.Kill([]int{member.Process.Pid, outside.Process.Pid}); n != 1 {
		t.Fatalf("Kill signalled %d, want 1", n)
	}
	if err := outside.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the outsider was killed: %v", err)
	}
	if err := member.Wait(); err == nil {
		t.Fatal("the member survived")
	}
}

// TestFreezeWithTheFreezerKeptActive: on cgroup v1, a freezer made by NewFreezer keeps the
// node's freezer_active key on (an empty cgroup kept frozen), so that a freeze and a thaw
// of an idle sandbox take a fraction of a millisecond instead of ~4 ms each (the key's flip
// patches the kernel's text on every CPU).
func TestFreezeWithTheFreezerKeptActive(t *testing.T) {
	_, f := testCgroup(t)
	if f.v2 {
		testutil.SkipOrFail(t, "cgroup v2's freezer has no freezer_active key")
	}
	state, err := os.ReadFile(filepath.Join(keepFreezerActiveCgroup, "freezer.state"))
	if err != nil || string(state) != "FROZEN\n" {
		t.Fatalf("%s: %q, %v; want FROZEN", keepFreezerActiveCgroup, state, err)
	}
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := os.WriteFile(filepath.Join(f.dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for range 20 {
		start := time.Now()
		if err := f.Freeze(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := f.Thaw(); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("freeze + thaw: median %s", took[len(took)/2])
}
