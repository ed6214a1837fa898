package proctpl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestInspectWhileFrozen: what Inspect reads of a process in a frozen cgroup (the offset of
// a file it writes without pause, its vDSO's syscall instruction) is what Wait reads at its
// stop after the thaw, and a copy of the template goes on from that offset.
func TestInspectWhileFrozen(t *testing.T) {
	testutil.RequiresRoot(t)
	out := filepath.Join(t.TempDir(), "out")
	// out is written line after line as fast as the process can
	w := exec.Command(pythonBinary(t), "-S", "-c",
		fmt.Sprintf("import os\nfd = os.open(%q, os.O_WRONLY|os.O_CREAT, 0o600)\ni = 0\nwhile True:\n    i += 1\n    os.write(fd, b'%%09d\\n' %% i)\n", out))
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Process.Kill(); _ = w.Wait() })
	pid := w.Process.Pid
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "writing", func() bool {
		st, err := os.Stat(out)
		return err == nil && st.Size() > 1000
	})
	thaw := freezeCgroup(t, pid)
	p, err := NewTracer().Seize(pid, noCheck)
	if err != nil {
		t.Fatal(err)
	}
	p.Inspect()
	if !p.inspected || len(p.offsets) == 0 {
		t.Fatalf("Inspect of a frozen process read nothing: inspected %v, offsets %v", p.inspected, p.offsets)
	}
	inspected, sysAddr := p.offsets, p.task.sysAddr
	time.Sleep(20 * time.Millisecond) // frozen: nothing moves
	thaw()
	tp := template(t, p) // Wait, then the fork
	atStop := fileOffsets(pid)
	want, err := syscallInVDSO(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	var fd int
	for f, off := range atStop {
		if f > 2 {
			fd = f
			if inspected[f] != off {
				t.Fatalf("fd %d: Inspect read offset %d while frozen, the process stopped at %d", f, inspected[f], off)
			}
		}
	}
	if fd == 0 || inspected[fd]%10 != 0 {
		t.Fatalf("offsets at the stop %v, inspected %v: want the written file's, at a line's end", atStop, inspected)
	}
	if sysAddr != want {
		t.Fatalf("Inspect found the syscall instruction at %#x, Wait's lookup at %#x", sysAddr, want)
	}
	// The copy goes on from the frozen offset: the line after it follows the one before it.
	c := rollback(t, tp, pid)
	time.Sleep(100 * time.Millisecond)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	off := inspected[fd]
	if int64(len(data)) < off+20 {
		t.Fatalf("the copy (%d) did not write after offset %d (file %d bytes)", c, off, len(data))
	}
	before, _ := strconv.Atoi(strings.TrimSpace(string(data[off-10 : off])))
	after, _ := strconv.Atoi(strings.TrimSpace(string(data[off : off+10])))
	if after != before+1 {
		t.Fatalf("line at the frozen offset %d is %d, the one before %d: the copy did not resume from the offset", off, after, before)
	}
}
