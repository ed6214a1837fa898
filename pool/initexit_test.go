package pool

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestInitExitSaysHow: the reason a sandbox is fenced for names how its init ended, read from
// the pidfd where the kernel keeps it (6.15+) and from containerd's task exit status
// (128+signal) elsewhere, so that an unexpected init exit explains itself.
func TestInitExitSaysHow(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		status       uint32 // containerd's, for kernels without PIDFD_INFO_EXIT
		want         string
	}{
		{"killed", "kill -KILL $$", 137, "killed by SIGKILL"},
		{"exit", "exit 3", 3, "exited with status 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", "read x; "+tc.script)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
			if err != nil {
				testutil.SkipOrFail(t, "pidfd_open: %v", err)
			}
			ref := &initRef{pid: uint32(cmd.Process.Pid), pidfd: os.NewFile(uintptr(fd), "pidfd")}
			defer ref.pidfd.Close()
			stdin.Close()
			_ = cmd.Wait() // reaped, as the shim reaps an init
			how := ref.exitStatus(func() (uint32, error) { return tc.status, nil })
			if !strings.HasPrefix(how, tc.want) {
				t.Fatalf("exit status %q, want %q", how, tc.want)
			}
			if how := ref.exitStatus(func() (uint32, error) { return 0, errors.New("no task") }); how != "" && !strings.HasPrefix(how, tc.want) {
				t.Fatalf("exit status without containerd %q, want %q or nothing", how, tc.want)
			}
		})
	}
}
