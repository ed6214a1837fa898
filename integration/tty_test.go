package integration

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// hostPTY is a pseudo-terminal on the host: the test holds the master, the CLI gets the slave.
type hostPTY struct {
	master *os.File
	slave  *os.File
	mu     sync.Mutex
	out    strings.Builder
	closed chan struct{}
}

func openHostPTY(t *testing.T, rows, cols uint16) *hostPTY {
	t.Helper()
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(mfd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	sfd, err := unix.Open("/dev/pts/"+strconv.Itoa(int(n)), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &hostPTY{master: os.NewFile(uintptr(mfd), "ptmx"), slave: os.NewFile(uintptr(sfd), "pts"), closed: make(chan struct{})}
	p.resize(t, rows, cols)
	go func() {
		defer close(p.closed)
		buf := make([]byte, 4096)
		for {
			n, err := p.master.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { p.master.Close(); p.slave.Close() })
	return p
}

func (p *hostPTY) resize(t *testing.T, rows, cols uint16) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(p.master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
}

func (p *hostPTY) screen() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *hostPTY) typeKeys(t *testing.T, s string) {
	t.Helper()
	if _, err := p.master.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until the screen matches re and returns its last submatch.
func (p *hostPTY) waitFor(t *testing.T, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	var m []string
	testutil.WaitFor(t, 20*time.Second, 10*time.Millisecond, "terminal to show "+re, func() bool {
		m = rx.FindStringSubmatch(p.screen())
		return m != nil
	})
	return m[len(m)-1]
}

// startCLI runs the CLI on the slave as the leader of a new session with the terminal as its
// controlling terminal, as a shell would start it.
func (p *hostPTY) startCLI(t *testing.T, d *daemon, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(d.env.bin, append([]string{"--address", d.address}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.slave, p.slave, p.slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func waitCLI(t *testing.T, cmd *exec.Cmd, screen func() string) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("the CLI was killed by %v (a local ^C: raw mode was not on?); screen:\n%q", ws.Signal(), screen())
		}
		return cmd.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the CLI did not exit; screen:\n%q", screen())
	}
	return -1
}

// TestExecTTY drives `deltabox exec -it` through a real pseudo-terminal on the host, in a
// user-namespaced sandbox (the default): the command sees a /dev/pts terminal of the
// sandbox's devpts, the window size follows the host terminal (SIGWINCH), Ctrl-C interrupts
// the command through the sandbox's line discipline (not the CLI: the local terminal is raw),
// the exit code comes back and the local terminal is restored.
func TestExecTTY(t *testing.T) {
	d := startDaemon(t)
	d.createPool("tty", busyboxImage, 1)
	sb := d.lease("tty")
	// the sandbox's /dev/pts is its own devpts instance, not the host's
	out := d.cli("exec", sb.ID, "sh", "-c", "grep ' /dev/pts ' /proc/mounts")
	mustContain(t, "the sandbox's /dev/pts mount", out, "devpts")

	p := openHostPTY(t, 40, 120)
	cmd := p.startCLI(t, d, "exec", "-it", sb.ID, "sh", "-c",
		`tty; stty size; while read x; do [ "$x" = q ] && break; stty size; done; echo ready; sleep 100`)
	p.waitFor(t, `/dev/pts/\d+\r\n`)
	p.waitFor(t, `40 120\r\n`)
	p.resize(t, 50, 132)
	// the resize travels through a SIGWINCH in the CLI: press return until stty sees it
	testutil.WaitFor(t, 20*time.Second, 50*time.Millisecond, "the sandbox terminal to be 50x132", func() bool {
		if strings.Contains(p.screen(), "50 132") {
			return true
		}
		p.typeKeys(t, "\r")
		return false
	})
	p.typeKeys(t, "q\r")
	p.waitFor(t, "ready")
	time.Sleep(100 * time.Millisecond) // sleep has started
	p.typeKeys(t, "\x03")
	if code := waitCLI(t, cmd, p.screen); code != 130 {
		t.Fatalf("exit code %d after ^C, want 130 (SIGINT in the sandbox); screen:\n%q", code, p.screen())
	}
	tio, err := unix.IoctlGetTermios(int(p.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if tio.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != unix.ICANON|unix.ECHO|unix.ISIG {
		t.Fatalf("the host terminal was left raw (lflag %#x)", tio.Lflag)
	}

	// Ctrl-D ends a command's input; the exit code is the command's
	p2 := openHostPTY(t, 24, 80)
	cmd = p2.startCLI(t, d, "exec", "-it", sb.ID, "sh", "-c", "echo ready; cat; echo done; exit 3")
	p2.waitFor(t, "ready")
	p2.typeKeys(t, "hello\r")
	p2.waitFor(t, `hello\r\nhello\r\n`)
	p2.typeKeys(t, "\x04")
	if code := waitCLI(t, cmd, p2.screen); code != 3 {
		t.Fatalf("exit code %d after ^D, want 3; screen:\n%q", code, p2.screen())
	}
	// The CLI wrote it before it exited; the host terminal's reader may not have taken it yet.
	p2.waitFor(t, "done")
}
