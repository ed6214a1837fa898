package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	containerd "github.com/containerd/containerd/v2/client"
	"golang.org/x/sys/unix"
)

// When a sandbox's init exits unexpectedly the daemon says how, so that the next such exit
// explains itself: the wait status (signal or exit code) read from the init's pidfd
// (PIDFD_GET_INFO with PIDFD_INFO_EXIT, Linux 6.15 and later: any holder of a pidfd may read
// it once the process is reaped) or else from containerd's task, and what the sandbox's
// cgroup counted (OOM kills, pids-limit hits). The init cannot tell who killed it: SIGKILL is
// the only signal that stops it (it drops the others, and is PID 1 of its namespace).

// pidfdInfo is struct pidfd_info (include/uapi/linux/pidfd.h).
type pidfdInfo struct {
	Mask                                                              uint64
	CgroupID                                                          uint64
	Pid, Tgid, Ppid, Ruid, Rgid, Euid, Egid, Suid, Sgid, Fsuid, Fsgid uint32
	ExitCode                                                          int32
	CoredumpMask                                                      uint32
	Spare1                                                            uint32
}

const (
	pidfdInfoExit = 1 << 3 // PIDFD_INFO_EXIT
	// pidfdGetInfo is PIDFD_GET_INFO, _IOWR(0xFF, 11, struct pidfd_info).
	pidfdGetInfo = 3<<30 | uint(unsafe.Sizeof(pidfdInfo{}))<<16 | 0xFF<<8 | 11
)

// pidfdExitStatus returns the wait status of the exited process behind fd, once its parent
// reaped it (it waits up to wait for that); ok is false where the kernel does not keep it.
func pidfdExitStatus(fd uintptr, wait time.Duration) (ws unix.WaitStatus, ok bool) {
	deadline := time.Now().Add(wait)
	for {
		info := pidfdInfo{Mask: pidfdInfoExit}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(pidfdGetInfo), uintptr(unsafe.Pointer(&info)))
		if errno == 0 && info.Mask&pidfdInfoExit != 0 {
			return unix.WaitStatus(info.ExitCode), true
		}
		if (errno != 0 && !errors.Is(errno, unix.ESRCH)) || time.Now().After(deadline) {
			return 0, false // ENOTTY, EINVAL: a kernel without it
		}
		time.Sleep(5 * time.Millisecond) // not reaped yet: the shim waits for it
	}
}

// describeWait says how a wait status ended a process.
func describeWait(ws unix.WaitStatus) string {
	switch {
	case ws.Signaled():
		s := "killed by " + unix.SignalName(ws.Signal())
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	case ws.Exited():
		return "exited with status " + strconv.Itoa(ws.ExitStatus())
	}
	return fmt.Sprintf("ended with wait status %#x", uint32(ws))
}

// exitStatus returns how the init behind r ended: from its pidfd, else from status (the
// containerd task's exit status, 128+signal for a signal), else "exited".
func (r *initRef) exitStatus(status func() (uint32, error)) string {
	var how string
	if raw, err := r.pidfd.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if ws, ok := pidfdExitStatus(fd, time.Second); ok {
				how = describeWait(ws)
			}
		})
	}
	if how != "" || status == nil {
		return how
	}
	code, err := status()
	switch {
	case err != nil:
		return ""
	case code > 128 && code < 128+65:
		return "killed by " + unix.SignalName(unix.Signal(code-128)) + " (task exit status " + strconv.Itoa(int(code)) + ")"
	}
	return "exited with status " + strconv.Itoa(int(code))
}

// cgroupCounts reads the counters of the sandbox's cgroup (v2) that explain a killed init:
// memory.events oom_kill and pids.events max. Missing files count nothing.
func (f Freezer) cgroupCounts() (oomKills, pidsMax int64) {
	return cgroupCounter(filepath.Join(f.dir, "memory.events"), "oom_kill"), cgroupCounter(filepath.Join(f.dir, "pids.events"), "max")
}

func cgroupCounter(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// initExitReason describes an unexpected exit of sb's init for the fence: how it ended and
// what its cgroup counted ("its init (pid 42) exited: killed by SIGKILL; its cgroup counted
// 1 OOM kill").
func (m *Manager) initExitReason(ctx context.Context, sb *sandbox, ref *initRef) (string, []any) {
	how := ref.exitStatus(func() (uint32, error) { return m.rt.taskExitStatus(ctx, sb.rec.CID) })
	var oom, pidsMax int64
	if sb.inst != nil && sb.inst.layout.Cgroup != "" {
		oom, pidsMax = NewFreezer(sb.inst.layout.Cgroup).cgroupCounts()
	}
	why := fmt.Sprintf("its init (pid %d) exited", ref.pid)
	if how != "" {
		why += ": " + how
	}
	if oom > 0 {
		why += fmt.Sprintf("; its cgroup counted %d OOM kills", oom)
	}
	if pidsMax > 0 {
		why += fmt.Sprintf("; its cgroup hit the pids limit %d times", pidsMax)
	}
	attrs := []any{"pid", ref.pid, "how", how, "oom_kills", oom, "pids_max_hits", pidsMax}
	if m.rt != nil {
		if data, err := os.ReadFile(filepath.Join(m.rt.containerDir(sb.rec.CID), "init.log")); err == nil {
			attrs = append(attrs, "init_log", tail(data, 400)) // an init that exits on an error says it there
		}
	}
	return why, attrs
}

// taskExitStatus returns the exit status containerd recorded for the container's stopped
// task (it waits up to a second for the shim to see the exit).
func (r *runtime) taskExitStatus(ctx context.Context, cid string) (uint32, error) {
	if r == nil || r.client == nil {
		return 0, errors.New("no containerd client")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	c, err := r.client.LoadContainer(ctx, cid)
	if err != nil {
		return 0, err
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := task.Status(ctx)
		if err != nil {
			return 0, err
		}
		if st.Status == containerd.Stopped {
			return st.ExitStatus, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("task of %s is %s", cid, st.Status)
		}
	}
}
