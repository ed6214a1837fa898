package proctpl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Restart codes a system call interrupted by a stop leaves in ax (include/linux/errno.h).
const (
	errRestartSys      = -512
	errRestartNoIntr   = -513
	errRestartNoHand   = -514
	errRestartBlock    = -516
	sysRestartSyscall  = 219 // restart_syscall on x86-64
	userCS64           = 0x33
	cloneParent        = unix.CLONE_PARENT | uintptr(unix.SIGCHLD)
	injectMaxSignalled = 64 // signal-delivery stops tolerated during one injection
)

// normalize rewinds a system call interrupted with a restart code so that resuming from regs
// re-enters it (CRIU's compel does the same), and clears orig_ax so that the kernel's own
// restart logic does not rewind it a second time.
func normalize(r unix.PtraceRegs) unix.PtraceRegs {
	if int64(r.Orig_rax) >= 0 {
		switch int64(r.Rax) {
		case errRestartSys, errRestartNoIntr, errRestartNoHand:
			r.Rax = r.Orig_rax
			r.Rip -= 2
		case errRestartBlock:
			r.Rax = sysRestartSyscall
			r.Rip -= 2
		}
	}
	r.Orig_rax = ^uint64(0)
	return r
}

// task is a traced process in a ptrace stop, with its registers as saved at the stop.
type task struct {
	pid     int
	regs    unix.PtraceRegs // normalized
	sysAddr uint64          // address of a syscall instruction in its vDSO
	pending []unix.Signal   // signals taken at signal-delivery stops, to pass on at resume
	// dropSignals: signals that arrive while the tracer runs calls in it are discarded (a
	// template's: whatever the sandbox sends a template must never reach its copies).
	dropSignals bool
	// step says how calls are injected (stepUnknown: not asked yet). A template and its
	// copies have the process's signal mask and dispositions, so they inherit its answer.
	step stepMode
}

// stepMode is how system calls are injected into a task.
type stepMode uint8

const (
	stepUnknown stepMode = iota
	// stepTrap: the task runs the call under PTRACE_SINGLESTEP and stops once, at the
	// single-step trap the kernel reports on its return (x86-64 sends it as a forced
	// SIGTRAP, which the tracer takes and never delivers): one ptrace stop per call.
	stepTrap
	// stepSyscall: PTRACE_SYSCALL, a stop at the call's entry and one at its exit. For a
	// task that blocks or ignores SIGTRAP: forcing the trap on it would reset SIGTRAP to
	// its default action and unblock it, changing the process's signal state.
	stepSyscall
)

// inject runs one system call in the stopped task t and returns its result and, when the
// call forked, the pid of the child (auto-attached, not yet waited for). t's registers are
// restored afterwards. Runs on the tracer thread.
//
// A call costs one ptrace stop where it can (stepTrap), two otherwise: a stop is a round trip
// through the scheduler for the tracee and the tracer (16 against 23-29 us per call on
// these machines when idle, BenchmarkInject; several times that in a loaded window).
func (t *task) inject(nr uint64, args ...uint64) (ret int64, child int, err error) {
	if t.step == stepUnknown {
		t.step = stepOf(t.pid)
	}
	r := t.regs
	r.Rip, r.Rax, r.Orig_rax = t.sysAddr, nr, ^uint64(0)
	a := [6]uint64{}
	copy(a[:], args)
	r.Rdi, r.Rsi, r.Rdx, r.R10, r.R8, r.R9 = a[0], a[1], a[2], a[3], a[4], a[5]
	if err := unix.PtraceSetRegs(t.pid, &r); err != nil {
		return 0, 0, fmt.Errorf("set registers of %d: %w", t.pid, err)
	}
	entered := false
	for i := 0; ; i++ {
		resume := unix.PtraceSyscall
		if t.step == stepTrap {
			resume = func(pid, _ int) error { return unix.PtraceSingleStep(pid) }
		}
		if err := resume(t.pid, 0); err != nil {
			return 0, child, fmt.Errorf("resume %d into an injected syscall: %w", t.pid, err)
		}
		st, err := waitStop(t.pid)
		if err != nil {
			return 0, child, err
		}
		switch {
		case st.event == unix.PTRACE_EVENT_FORK || st.event == unix.PTRACE_EVENT_CLONE:
			msg, err := unix.PtraceGetEventMsg(t.pid)
			if err != nil {
				return 0, child, err
			}
			child = int(msg)
		case t.step == stepTrap && st.event == 0 && st.sig == unix.SIGTRAP && i < injectMaxSignalled:
			// The step's trap, or a SIGTRAP sent to the process: where it stopped tells.
			var at unix.PtraceRegs
			if err := unix.PtraceGetRegs(t.pid, &at); err != nil {
				return 0, child, err
			}
			switch at.Rip {
			case t.sysAddr + 2: // past the syscall instruction: the call ran
				// A SIGTRAP sent while the call ran absorbs the step's (one SIGTRAP is
				// pending at a time): it is the process's, passed on as any signal.
				if !stepTrapped(t.pid) && !t.dropSignals {
					t.pending = append(t.pending, st.sig)
				}
				return int64(at.Rax), child, t.restore()
			case t.sysAddr: // sent to the process and delivered before the call ran
				if !t.dropSignals {
					t.pending = append(t.pending, st.sig)
				}
			default:
				return 0, child, fmt.Errorf("process %d trapped at %#x during a syscall injected at %#x", t.pid, at.Rip, t.sysAddr)
			}
		case t.step == stepSyscall && st.syscall() && !entered:
			entered = true
		case t.step == stepSyscall && st.syscall():
			if err := unix.PtraceGetRegs(t.pid, &r); err != nil {
				return 0, child, err
			}
			return int64(r.Rax), child, t.restore()
		case st.signal() && i < injectMaxSignalled:
			if !t.dropSignals {
				t.pending = append(t.pending, st.sig)
			}
		case st.event == unix.PTRACE_EVENT_STOP:
			// a group stop or another interrupt: keep going
		default:
			return 0, child, fmt.Errorf("unexpected stop of %d during an injected syscall (signal %v, event %d)", t.pid, st.sig, st.event)
		}
	}
}

// trapSIGTRAP is SIGTRAP's bit in the masks of /proc/PID/stat.
const trapSIGTRAP = 1 << (unix.SIGTRAP - 1)

// stepOf is how calls are injected into pid: stepTrap when its SIGTRAP is neither blocked
// nor ignored (trapFree), else stepSyscall.
func stepOf(pid int) stepMode {
	if trapFree(pid) {
		return stepTrap
	}
	return stepSyscall
}

// trapFree reports whether pid neither blocks nor ignores SIGTRAP (/proc/PID/stat's
// "blocked" and "sigignore"), so that the single-step trap of an injected call is a
// signal-delivery stop the tracer takes, and nothing of the process's signal state
// changes. Anything unreadable is a no.
func trapFree(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return false
	}
	// After the comm: state is field 3; blocked is field 32 and sigignore 33.
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 31 {
		return false
	}
	blocked, err1 := strconv.ParseUint(f[29], 10, 64)
	ignored, err2 := strconv.ParseUint(f[30], 10, 64)
	return err1 == nil && err2 == nil && (blocked|ignored)&trapSIGTRAP == 0
}

// stepTrapped reports whether the SIGTRAP pid stopped with is the kernel's single-step
// report (si_code TRAP_BRKPT, which no other process can send: the kernel refuses a positive
// si_code from user space for anyone but the sender itself), not one sent to it.
func stepTrapped(pid int) bool {
	var si unix.Siginfo
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_GETSIGINFO, uintptr(pid), 0, uintptr(unsafe.Pointer(&si)), 0, 0)
	return e == 0 && si.Signo == int32(unix.SIGTRAP) && si.Code == trapBrkpt
}

// trapBrkpt is TRAP_BRKPT (asm-generic/siginfo.h), the si_code of x86-64's single-step report
// after a system call.
const trapBrkpt = 1

// restore puts t's saved registers back.
func (t *task) restore() error {
	r := t.regs
	if err := unix.PtraceSetRegs(t.pid, &r); err != nil {
		return fmt.Errorf("restore registers of %d: %w", t.pid, err)
	}
	return nil
}

// syscallInVDSO finds a syscall instruction (0f 05) in pid's vDSO. The kernel maps the same
// vDSO image into every 64-bit process, so the instruction's offset in it is learnt once
// (from the daemon's own vDSO) and a process's vDSO base is read from its auxiliary vector
// (AT_SYSINFO_EHDR: a few dozen bytes, against its whole memory map); the two bytes there
// are read back before they are used. A process that moved or replaced its vDSO falls
// back to the map's [vdso] entry.
func syscallInVDSO(pid int) (uint64, error) {
	if off, ok := vdsoSyscallOffset(); ok {
		if base, ok := auxvVDSO(pid); ok {
			if b, err := readMem(pid, base+off, 2); err == nil && b[0] == 0x0f && b[1] == 0x05 {
				return base + off, nil
			}
		}
	}
	return syscallInVDSOMaps(pid)
}

// vdsoSyscallOffset is the offset of the first syscall instruction in the kernel's vDSO
// image, read once from the daemon's own.
var vdsoSyscallOffset = sync.OnceValues(func() (uint64, bool) {
	pid := os.Getpid()
	base, ok := auxvVDSO(pid)
	if !ok {
		return 0, false
	}
	addr, err := syscallInVDSOMaps(pid)
	if err != nil || addr < base {
		return 0, false
	}
	return addr - base, true
})

// atSysinfoEHDR is the auxiliary vector's entry for the vDSO's base (linux/auxvec.h).
const atSysinfoEHDR = 33

// auxvVDSO reads the vDSO's base address from pid's auxiliary vector.
func auxvVDSO(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/auxv", pid))
	if err != nil {
		return 0, false
	}
	for i := 0; i+16 <= len(data); i += 16 {
		switch binary.NativeEndian.Uint64(data[i:]) {
		case atSysinfoEHDR:
			v := binary.NativeEndian.Uint64(data[i+8:])
			return v, v != 0
		case 0: // AT_NULL
			return 0, false
		}
	}
	return 0, false
}

// syscallInVDSOMaps finds a syscall instruction in the [vdso] entry of pid's memory map.
func syscallInVDSOMaps(pid int) (uint64, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if !strings.HasSuffix(line, "[vdso]") {
			continue
		}
		lo, hi, ok := strings.Cut(strings.Fields(line)[0], "-")
		if !ok {
			break
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start || end-start > 1<<20 {
			break
		}
		buf, err := readMem(pid, start, int(end-start))
		if err != nil {
			return 0, fmt.Errorf("read the vDSO of %d: %w", pid, err)
		}
		if i := bytes.Index(buf, []byte{0x0f, 0x05}); i >= 0 {
			return start + uint64(i), nil
		}
		break
	}
	return 0, fmt.Errorf("process %d: no syscall instruction in its vDSO: %w", pid, errdefs.ErrNotImplemented)
}

// Threads reads the thread count of pid.
func Threads(pid int) (int, error) { return threads(pid) }

// threads reads the thread count of pid.
func threads(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Threads line in /proc/PID/status")
}

// readMem reads n bytes at addr of a process the tracer has stopped.
func readMem(pid int, addr uint64, n int) ([]byte, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, int64(addr)); err != nil {
		return nil, err
	}
	return buf, nil
}
