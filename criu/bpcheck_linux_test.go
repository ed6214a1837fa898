//go:build linux

package criu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestBreakpointsTrapAgreesWithCRIU: the probe's answer is the one CRIU gets. Where the probe
// says breakpoints trap, a dump of a plain process without CRIU_FAULT does not hang; where it
// says they do not, that dump hangs (killed after 10 s) and one with CRIU_FAULT=130 does not.
func TestBreakpointsTrapAgreesWithCRIU(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "criu")
	ok, err := BreakpointsTrap(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hardware breakpoints trap on this host: %v", ok)
	// dump returns what the CRIU run returned (exit 124: killed by the timeout).
	dump := func(env ...string) error {
		sleep := exec.Command("sleep", "100")
		// Its own session: CRIU refuses a task whose session leader it cannot see (CI runs the
		// tests in a pid namespace whose session leader is outside it).
		sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := sleep.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { sleep.Process.Kill(); sleep.Wait() }()
		time.Sleep(100 * time.Millisecond)
		dir := t.TempDir()
		cmd := exec.Command("timeout", "10", "criu", "dump", "-t", strconv.Itoa(sleep.Process.Pid), "-D", dir, "--shell-job", "--leave-running", "-o", "dump.log", "-v4")
		cmd.Env = append(os.Environ(), env...)
		err := cmd.Run()
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
			t.Logf("criu dump %v: %v; log tail: %s", env, err, lastBytes(string(log), 300))
		}
		return err
	}
	// What the breakpoint decides is whether CRIU hangs when it cures the parasite (killed by
	// the timeout: exit 124), not whether the dump succeeds: a dump can fail later for reasons of
	// the environment the test runs in (CI runs it in a pid and mount namespace of its own,
	// whose mounts CRIU cannot always look up), which the breakpoint does not change.
	hung := func(err error) bool {
		var exit *exec.ExitError
		return errors.As(err, &exit) && exit.ExitCode() == 124
	}
	if ok {
		if err := dump(); hung(err) {
			t.Fatal("the probe says breakpoints trap but a CRIU dump without CRIU_FAULT hung")
		}
		return
	}
	if err := dump(); !hung(err) {
		t.Fatalf("the probe says breakpoints do not trap but a CRIU dump without CRIU_FAULT did not hang: %v", err)
	}
	if err := dump(NoBreakpointsEnv); hung(err) {
		t.Fatalf("a CRIU dump with %s hung", NoBreakpointsEnv)
	}
}

// TestPeerEnvHas finds a unix socket server's environment through SO_PEERCRED.
func TestPeerEnvHas(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	has, err := PeerEnvHas(path, "PATH="+os.Getenv("PATH"))
	if err != nil || !has {
		t.Fatalf("PATH of the test process not found: %v %v", has, err)
	}
	if has, err := PeerEnvHas(path, "DELTABOX_NO_SUCH=1"); err != nil || has {
		t.Fatalf("a variable the process lacks was found: %v %v", has, err)
	}
}

// TestCheckBreakpoints: L3 stays on where breakpoints trap or containerd (here a stand-in
// serving a unix socket) runs with CRIU_FAULT=130, and goes off, naming the variable, where
// neither holds. Both answers of the probe are tried (this VM's breakpoints trap in some
// probes and not in others: a probe of the test's own and CheckBreakpoints' disagreed once
// in five runs); the real probe runs in TestBreakpointsTrap.
func TestCheckBreakpoints(t *testing.T) {
	for _, traps := range []bool{true, false} {
		t.Run(fmt.Sprintf("traps=%v", traps), func(t *testing.T) {
			defer func(f func(time.Duration) (bool, error)) { breakpointsTrap = f }(breakpointsTrap)
			breakpointsTrap = func(time.Duration) (bool, error) { return traps, nil }
			checkBreakpoints(t, traps)
		})
	}
}

// TestBreakpointsTrap runs the real probe: it answers, without an error, within its timeout.
func TestBreakpointsTrap(t *testing.T) {
	testutil.RequiresRoot(t)
	start := time.Now()
	if _, err := BreakpointsTrap(time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("probe took %v with a timeout of 1s", d)
	}
}

func checkBreakpoints(t *testing.T, traps bool) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "python3")
	serve := func(env ...string) string {
		path := filepath.Join(t.TempDir(), "c.sock")
		cmd := exec.Command("python3", "-c", `import socket,sys
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); print("up", flush=True)
while True: s.accept()[0].close()`, path)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		buf := make([]byte, 3)
		if _, err := out.Read(buf); err != nil {
			t.Fatal(err)
		}
		return path
	}
	on := Status{Available: true}
	st, err := CheckBreakpoints(on, "unix://"+serve(NoBreakpointsEnv))
	if err != nil || !st.Available {
		t.Fatalf("containerd with %s: %+v %v", NoBreakpointsEnv, st, err)
	}
	st, err = CheckBreakpoints(on, serve())
	if err != nil {
		t.Fatal(err)
	}
	if st.Available != traps {
		t.Fatalf("containerd without %s, breakpoints trap %v: available %v (%s)", NoBreakpointsEnv, traps, st.Available, st.Reason)
	}
	if !traps && !strings.Contains(st.Reason, NoBreakpointsEnv) {
		t.Fatalf("reason does not name %s: %s", NoBreakpointsEnv, st.Reason)
	}
}
