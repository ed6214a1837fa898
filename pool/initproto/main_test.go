package initproto_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

// initBinary is the real deltabox-init, built once by TestMain.
var initBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deltabox-init-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	initBinary = filepath.Join(dir, "deltabox-init")
	build := exec.Command("go", "build", "-o", initBinary, "github.com/deltabox/deltabox/cmd/deltabox-init")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build deltabox-init: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// initProc is a running deltabox-init child.
type initProc struct {
	cmd     *exec.Cmd
	wrapped bool // cmd is a wrapper (unshare) that kills the init when it dies
	client  *initproto.Client
	socket  string
	done    chan error
}

// startInit starts the init with a socket in a fresh temp dir and returns once it answers.
func startInit(tb testing.TB, env ...string) *initProc {
	tb.Helper()
	return startWrapped(tb, nil, env...)
}

// startWrapped starts the init under a wrapper command (e.g. unshare), or directly.
func startWrapped(tb testing.TB, wrapper []string, env ...string) *initProc {
	tb.Helper()
	socket := filepath.Join(tb.TempDir(), "init.sock")
	argv := append(slices.Clone(wrapper), initBinary, "-socket", socket, "-kill-timeout", "3s")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logWriter{tb}
	if _, bench := tb.(*testing.B); bench {
		cmd.Stderr = nil // benchmark output would print every log line
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start init: %v", err)
	}
	p := &initProc{cmd: cmd, wrapped: wrapper != nil, client: initproto.New(socket), socket: socket, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	tb.Cleanup(func() { p.stop(tb) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.client.WaitReady(ctx, 2*time.Millisecond); err != nil {
		tb.Fatalf("init not ready: %v", err)
	}
	return p
}

// stop sends SIGTERM and waits for the init to exit. A wrapper (unshare) is killed instead
// and passes SIGKILL on (--kill-child); the init's exit is then seen by its socket no
// longer answering.
func (p *initProc) stop(tb testing.TB) {
	if p.cmd.ProcessState != nil {
		return
	}
	if p.wrapped {
		_ = p.cmd.Process.Kill()
		<-p.done
		testutil.WaitFor(tb, 10*time.Second, 5*time.Millisecond, "init to stop listening", func() bool {
			_, err := p.client.Ping(context.Background())
			return errors.Is(err, initproto.ErrNotListening)
		})
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		tb.Errorf("init did not exit on SIGTERM")
	}
}

// run executes req and returns its status and outputs, failing the test on a transport error.
func (p *initProc) run(tb testing.TB, req initproto.ExecRequest) (initproto.ExitStatus, string, string) {
	tb.Helper()
	var out, errb strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := p.client.Exec(ctx, req, nil, &out, &errb)
	if err != nil {
		tb.Fatalf("exec %v: %v", req.Argv, err)
	}
	return st, out.String(), errb.String()
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// exists reports whether /proc/pid exists at all (zombies included).
func exists(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, 5*time.Millisecond, fmt.Sprintf("pid %d to be reaped", pid), func() bool {
		return !exists(pid)
	})
}

func firstLinePid(t *testing.T, out string) int {
	t.Helper()
	line, _, _ := strings.Cut(out, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("want a pid on the first line of %q: %v", out, err)
	}
	return pid
}

// logWriter sends the init's log lines to the test log (shown on failure or with -v).
type logWriter struct{ tb testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.tb.Logf("init: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
