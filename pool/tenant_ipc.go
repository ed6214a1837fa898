package pool

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// System V IPC control commands (linux/ipc.h, shm.h, msg.h, sem.h).
const (
	ipcRMID = 0
	msgStat = 11
	msgInfo = 12
	shmStat = 13
	shmInfo = 14
	semStat = 18
	semInfo = 19
)

// ipcKind is one System V IPC object type: its ctl syscall and where its INFO result says
// how many objects exist.
type ipcKind struct {
	name        string
	stat, info  int
	inUseOffset int // byte offset of the in-use count (an int) in the INFO buffer
	ctl         func(id, cmd int, buf unsafe.Pointer) (int, error)
}

var ipcKinds = []ipcKind{
	{"shared memory segment", shmStat, shmInfo, 0, func(id, cmd int, buf unsafe.Pointer) (int, error) {
		r, _, e := unix.Syscall(unix.SYS_SHMCTL, uintptr(id), uintptr(cmd), uintptr(buf))
		return int(r), errnoErr(e)
	}},
	{"message queue", msgStat, msgInfo, 0, func(id, cmd int, buf unsafe.Pointer) (int, error) {
		r, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), uintptr(cmd), uintptr(buf))
		return int(r), errnoErr(e)
	}},
	{"semaphore set", semStat, semInfo, 7 * 4, func(id, cmd int, buf unsafe.Pointer) (int, error) {
		r, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, uintptr(cmd), uintptr(buf), 0, 0)
		return int(r), errnoErr(e)
	}},
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// clearIPC removes every System V shared memory segment, message queue and semaphore set of
// the init's IPC namespace and checks that none is left. It runs on an OS thread that joins
// the namespace through the init's pidfd (never by pid number) and is then left to die with
// its goroutine (never unlocked), so no other goroutine ever runs in the sandbox's namespace.
// POSIX message queues are files of the sandbox's /dev/mqueue, cleared with the tmpfs.
func (r *initRef) clearIPC() (int, error) {
	raw, err := r.pidfd.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("pidfd of sandbox init %d: %w", r.pid, err)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with this goroutine
		var res result
		cerr := raw.Control(func(fd uintptr) {
			if err := unix.Setns(int(fd), unix.CLONE_NEWIPC); err != nil {
				res.err = fmt.Errorf("join the IPC namespace of sandbox init %d: %w", r.pid, err)
				return
			}
			res.n, res.err = removeAllIPC()
		})
		res.err = errors.Join(res.err, cerr)
		done <- res
	}()
	res := <-done
	return res.n, res.err
}

// removeAllIPC removes the objects of the calling thread's IPC namespace.
func removeAllIPC() (int, error) {
	var buf [512]byte // larger than any of shmid_ds, msqid_ds, semid_ds and their INFO structs
	p := unsafe.Pointer(&buf[0])
	n := 0
	for _, k := range ipcKinds {
		maxIdx, err := k.ctl(0, k.info, p)
		if err != nil {
			return n, fmt.Errorf("list %ss: %w", k.name, err)
		}
		for i := 0; i <= maxIdx; i++ {
			id, err := k.ctl(i, k.stat, p)
			if err != nil {
				continue // a free slot
			}
			if _, err := k.ctl(id, ipcRMID, nil); err != nil {
				return n, fmt.Errorf("remove %s %d: %w", k.name, id, err)
			}
			n++
		}
		if _, err := k.ctl(0, k.info, p); err != nil {
			return n, fmt.Errorf("count %ss: %w", k.name, err)
		}
		if left := *(*int32)(unsafe.Pointer(&buf[k.inUseOffset])); left != 0 {
			return n, fmt.Errorf("%d %ss are left in the sandbox's IPC namespace after removing them all: not reusable", left, k.name)
		}
	}
	return n, nil
}
