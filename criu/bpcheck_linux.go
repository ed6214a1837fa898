//go:build linux

package criu

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// NoBreakpointsEnv is what a CRIU process needs in its environment on a host that does not
// deliver hardware breakpoints: CRIU_FAULT=130 (FI_NO_BREAKPOINTS) makes it stop a process
// leaving the parasite with PTRACE_SYSCALL instead of a debug-register breakpoint. Without
// it, every dump on such a host (some virtual machines) hangs in wait4 with the sandbox
// frozen. CRIU runs under runc, under containerd's shim, and inherits containerd's
// environment: that is where it must be set.
const NoBreakpointsEnv = "CRIU_FAULT=130"

// offsetof(struct user, u_debugreg) on amd64: the debug registers as PTRACE_POKEUSER
// addresses them (DR0 at +0, DR7 at +7 words).
const userDebugRegs = 848

// BreakpointsTrap reports whether this host delivers a hardware breakpoint set through
// ptrace, as CRIU sets one to catch a process leaving its parasite: a busy-looping child is
// stopped, DR0 is pointed at the instruction it is about to run, and it must trap within
// timeout. No library does this; it is the host property CRIU's dumps depend on.
func BreakpointsTrap(timeout time.Duration) (bool, error) {
	if runtime.GOARCH != "amd64" {
		return true, nil // the offsets above are amd64's; other hosts are not probed
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return false, err
	}
	type result struct {
		ok  bool
		err error
	}
	c := make(chan result, 1)
	go func() {
		// Every ptrace request must come from the thread that attached; the thread is
		// given back once the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ok, err := probeBreakpoint(sh, timeout)
		c <- result{ok, err}
	}()
	r := <-c
	return r.ok, r.err
}

// breakpointsTrap is BreakpointsTrap; tests of CheckBreakpoints replace it, since on some
// virtual machines a breakpoint traps in one probe and not in the next.
var breakpointsTrap = BreakpointsTrap

func probeBreakpoint(sh string, timeout time.Duration) (bool, error) {
	cmd := exec.Command(sh, "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		return false, err
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		_ = cmd.Wait()
	}()
	if err := unix.PtraceSeize(pid); err != nil {
		return false, fmt.Errorf("seize probe: %w", err)
	}
	if err := unix.PtraceInterrupt(pid); err != nil {
		return false, fmt.Errorf("interrupt probe: %w", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		return false, fmt.Errorf("wait for the probe to stop: %w", err)
	}
	if !ws.Stopped() {
		return false, fmt.Errorf("probe did not stop: %v", ws)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		return false, fmt.Errorf("probe registers: %w", err)
	}
	if err := pokeUser(pid, userDebugRegs, uintptr(regs.Rip)); err != nil {
		return false, fmt.Errorf("set DR0: %w", err)
	}
	if err := pokeUser(pid, userDebugRegs+7*8, 1); err != nil { // DR7: L0, execute, 1 byte
		return false, fmt.Errorf("enable DR0: %w", err)
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return false, fmt.Errorf("continue probe: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		wpid, err := unix.Wait4(pid, &ws, unix.WALL|unix.WNOHANG, nil)
		if err != nil {
			return false, fmt.Errorf("wait for the probe's trap: %w", err)
		}
		if wpid == pid {
			if ws.Stopped() && ws.StopSignal() == unix.SIGTRAP {
				return true, nil
			}
			if !ws.Stopped() {
				return false, fmt.Errorf("probe ended: %v", ws)
			}
			if err := unix.PtraceCont(pid, 0); err != nil { // some other stop: go on
				return false, fmt.Errorf("continue probe: %w", err)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false, nil
}

func pokeUser(pid int, off, val uintptr) error {
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_POKEUSR, uintptr(pid), off, val, 0, 0); e != 0 {
		return e
	}
	return nil
}

// ErrNoBreakpoints is the reason L3 is off on a host that does not deliver hardware
// breakpoints while containerd runs without NoBreakpointsEnv.
var ErrNoBreakpoints = errors.New("this host does not deliver hardware breakpoints (some virtual machines do not), and CRIU's dumps hang there unless CRIU runs with " + NoBreakpointsEnv)

// PeerEnvHas reports whether the process serving the unix socket at path (containerd, found
// by SO_PEERCRED) has kv in its environment.
func PeerEnvHas(path, kv string) (bool, error) {
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return false, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return false, err
	}
	if serr != nil {
		return false, serr
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cred.Pid))
	if err != nil {
		return false, err
	}
	for _, e := range bytes.Split(env, []byte{0}) {
		if string(e) == kv {
			return true, nil
		}
	}
	return false, nil
}

// CheckBreakpoints turns st unavailable when the containerd at address (whose environment
// CRIU inherits) lacks NoBreakpointsEnv and this host's breakpoints do not trap. The probe
// runs only when containerd lacks it. A probe or a look at containerd that fails leaves st
// as it is (and says so in the returned error).
func CheckBreakpoints(st Status, address string) (Status, error) {
	if !st.Available {
		return st, nil
	}
	has, err := PeerEnvHas(strings.TrimPrefix(address, "unix://"), NoBreakpointsEnv)
	if err == nil && has {
		return st, nil
	}
	ok, perr := breakpointsTrap(250 * time.Millisecond)
	if perr != nil || ok {
		return st, perr
	}
	if err != nil {
		return st, fmt.Errorf("%w; cannot read containerd's environment: %v", ErrNoBreakpoints, err)
	}
	st.Available = false
	st.Reason = ErrNoBreakpoints.Error() + ": start containerd with " + NoBreakpointsEnv + " in its environment (hack/containerd.sh does)"
	return st, nil
}
