package pool

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// A leased sandbox whose init exited shows as "failed" with the reason (what inspect and ls
// print); one whose init runs, or was replaced on purpose, shows as leased.
func TestViewShowsAFencedSandboxAsFailed(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		testutil.SkipOrFail(t, "pidfd_open: %v", err)
	}
	ref := &initRef{pid: uint32(cmd.Process.Pid), pidfd: os.NewFile(uintptr(fd), "pidfd"),
		exited: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { ref.pidfd.Close() })
	sb := &sandbox{inst: &instance{}}
	sb.inst.ref.Store(ref)
	m := &Manager{}
	if v := m.view(nil, sb); v.State != "leased" || v.Reason != "" {
		t.Fatalf("running init: state %q (%q), want leased", v.State, v.Reason)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	v := m.view(nil, sb)
	if v.State != "failed" || !strings.Contains(v.Reason, "init (pid "+strconv.Itoa(cmd.Process.Pid)+") exited") {
		t.Fatalf("exited init: state %q (%q), want failed naming the init's exit", v.State, v.Reason)
	}
	ref.fail("fenced for a test reason")
	if v := m.view(nil, sb); v.State != "failed" || v.Reason != "fenced for a test reason" {
		t.Fatalf("fenced: state %q (%q), want failed with the fence's reason", v.State, v.Reason)
	}
	retired := &initRef{pid: ref.pid, pidfd: ref.pidfd, exited: make(chan struct{}), done: make(chan struct{}), retired: true}
	sb.inst.ref.Store(retired)
	if v := m.view(nil, sb); v.State != "leased" {
		t.Fatalf("init replaced on purpose: state %q (%q), want leased", v.State, v.Reason)
	}
}
