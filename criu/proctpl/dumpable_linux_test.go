package proctpl

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// nobody is the unprivileged user of these tests: a process of the sandbox's user without
// CAP_SYS_PTRACE, as a hostile process inside would be.
var nobody = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}

// startAsNobody starts argv as nobody and waits until it runs argv[0] (after its exec).
func startAsNobody(t *testing.T, comm string, argv ...string) int {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = nobody
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, comm+" running", func() bool {
		return procComm(pid) == comm && procState(pid) == "S"
	})
	return pid
}

func procComm(pid int) string {
	out, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(out))
}

// openMemAs tries, as nobody, what a hostile process of the same user would: open
// pid's /proc/PID/mem for writing. nil means it could.
func openMemAs(pid int) error {
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf("exec 3<>/proc/%d/mem", pid))
	cmd.SysProcAttr = nobody
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// TestTemplateIsNeverDumpable: the sandbox runs while its templates are made, so a
// template must be non-dumpable from the instant its clone returns: one hidden afterwards
// could have its memory file opened (and kept open, writable) by a process of the same user
// in between. Checked at that instant (the hook runs before anything else is done to the
// template), then: the original and its copies have their flag back; a process that had
// made itself non-dumpable gets copies that are too.
func TestTemplateIsNeverDumpable(t *testing.T) {
	testutil.RequiresRoot(t)
	tr := NewTracer()
	pid := startAsNobody(t, "sleep", "/bin/sleep", "1000")
	if err := openMemAs(pid); err != nil {
		t.Fatalf("the test's attacker cannot open its own user's process: %v", err)
	}
	var atBirth []error
	testHookForked = func(child int) { atBirth = append(atBirth, openMemAs(child)) }
	t.Cleanup(func() { testHookForked = nil })
	tp := checkpoint(t, tr, pid)
	if len(atBirth) != 1 {
		t.Fatalf("the fork hook ran %d times, want 1", len(atBirth))
	}
	if atBirth[0] == nil {
		t.Fatalf("template %d was dumpable when its clone returned: a process of the sandbox's user could open its memory", tp.Pid())
	}
	if err := openMemAs(tp.Pid()); err == nil {
		t.Fatalf("template %d's memory opened by a process of its user", tp.Pid())
	}
	if err := openMemAs(pid); err != nil {
		t.Fatalf("the original is not dumpable after its template: %v", err)
	}
	c := rollback(t, tp, pid)
	if err := openMemAs(c); err != nil {
		t.Fatalf("the copy is not dumpable like the original: %v", err)
	}

	// A process that made itself non-dumpable: its template and copies stay so.
	hidden := startAsNobody(t, "python3", "/usr/bin/python3", "-S", "-c",
		"import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(1000)") // PR_SET_DUMPABLE 0
	testutil.WaitFor(t, 5*time.Second, 5*time.Millisecond, "python3 non-dumpable", func() bool { return openMemAs(hidden) != nil })
	tp2 := checkpoint(t, tr, hidden)
	if tp2.dumpable != 0 {
		t.Fatalf("template of a non-dumpable process records dumpable %d", tp2.dumpable)
	}
	c2 := rollback(t, tp2, hidden)
	if err := openMemAs(c2); err == nil {
		t.Fatalf("copy %d of a non-dumpable process is dumpable", c2)
	}
}
