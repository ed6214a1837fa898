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

	"golang.org/x/sys/unix"

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

// startOutside starts sleep outside any test cgroup (a host process).
func startOutside(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
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
	outside := startOutside(t)
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

// TestPinnedListsTheFrozenSandbox: the list pinned before the freeze, brought up to date in
// the frozen window, is what ProcsExcept reads (skip honoured); a pinned process whose pid
// now belongs to another process is not taken for it; Kill reaches only members.
func TestPinnedListsTheFrozenSandbox(t *testing.T) {
	_, f := testCgroup(t)
	a, b, skipped := startIn(t, f.dir), startIn(t, f.dir), startIn(t, f.dir)
	skip := map[int]bool{skipped.Process.Pid: true}
	p := f.Pin(skip)
	if p == nil {
		t.Fatal("Pin could not list the cgroup")
	}
	defer p.Close()
	if err := f.Freeze(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := p.Procs()
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.ProcsExcept(skip)
	if err != nil {
		t.Fatal(err)
	}
	sortProcs(got)
	sortProcs(want)
	if len(want) != 2 || !slices.Equal(got, want) {
		t.Fatalf("pinned list %v, ProcsExcept %v (want a and b: %d, %d)", got, want, a.Process.Pid, b.Process.Pid)
	}
	if err := f.Thaw(); err != nil {
		t.Fatal(err)
	}

	// b exits and is reaped; a new process c joins. Forge the reuse of b's pid by c: c's pid
	// pinned with b's (dead) pidfd and another start time. Procs must read c's own start time.
	bp := b.Process.Pid
	_ = b.Process.Kill()
	_ = b.Wait()
	c := startIn(t, f.dir)
	cStart, err := procStart(c.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p.procs[c.Process.Pid], p.fds[c.Process.Pid] = Proc{Pid: c.Process.Pid, Start: cStart + 1000}, p.fds[bp]
	delete(p.fds, bp)
	got, err = p.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, Proc{Pid: c.Process.Pid, Start: cStart}) || slices.ContainsFunc(got, func(q Proc) bool { return q.Pid == bp }) {
		t.Fatalf("after b's exit and c's start: %v; want c with start %d and no b (%d)", got, cStart, bp)
	}

	// Kill: listed processes through their pidfds; a pid Procs did not list (a host process)
	// only if it is a member, which it is not.
	outside := startOutside(t)
	if n := p.Kill([]int{c.Process.Pid, outside.Process.Pid}); n != 1 {
		t.Fatalf("Kill signalled %d, want 1 (c only)", n)
	}
	if err := c.Wait(); err == nil {
		t.Fatal("c survived the kill")
	}
	if err := outside.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the host process was killed: %v", err)
	}
}

func sortProcs(ps []Proc) { slices.SortFunc(ps, func(a, b Proc) int { return a.Pid - b.Pid }) }

// TestPinnedKillDiesAtIdlePriority: a process killed in the frozen window is made SCHED_IDLE
// before its SIGKILL, so that at the thaw it exits without preempting the thread that thaws
// (the rollback's); a process it does not kill keeps its policy.
func TestPinnedKillDiesAtIdlePriority(t *testing.T) {
	_, f := testCgroup(t)
	victim, kept := startIn(t, f.dir), startIn(t, f.dir)
	p := f.Pin(nil)
	if p == nil {
		t.Fatal("Pin could not list the cgroup")
	}
	defer p.Close()
	if err := f.Freeze(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Procs(); err != nil {
		t.Fatal(err)
	}
	if n := p.Kill([]int{victim.Process.Pid}); n != 1 {
		t.Fatalf("Kill signalled %d, want 1", n)
	}
	for pid, want := range map[int]uint32{victim.Process.Pid: unix.SCHED_IDLE, kept.Process.Pid: unix.SCHED_NORMAL} {
		attr, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if attr.Policy != want {
			t.Errorf("process %d: policy %d in the frozen window, want %d", pid, attr.Policy, want)
		}
	}
	if err := f.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err := victim.Wait(); err == nil {
		t.Fatal("the killed process survived")
	}
}
