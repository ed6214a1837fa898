package pool

import (
	goruntime "runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestRemoveAllIPC: in a fresh IPC namespace (on a thread that then dies), every System V
// object kind, keyed or private, is removed and counted, and none is left.
func TestRemoveAllIPC(t *testing.T) {
	testutil.RequiresRoot(t)
	type result struct {
		n, left int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread in the new namespace dies with us
		var res result
		defer func() { done <- res }()
		if res.err = unix.Unshare(unix.CLONE_NEWIPC); res.err != nil {
			return
		}
		for _, key := range []int{0x5ec7, 0} { // keyed and IPC_PRIVATE
			if _, res.err = unix.SysvShmGet(key, 4096, unix.IPC_CREAT|0o600); res.err != nil {
				return
			}
			if _, _, e := unix.Syscall(unix.SYS_MSGGET, uintptr(key), unix.IPC_CREAT|0o600, 0); e != 0 {
				res.err = e
				return
			}
			if _, _, e := unix.Syscall(unix.SYS_SEMGET, uintptr(key), 1, unix.IPC_CREAT|0o600); e != 0 {
				res.err = e
				return
			}
		}
		if res.n, res.err = removeAllIPC(); res.err != nil {
			return
		}
		var buf [512]byte
		for _, k := range ipcKinds {
			if _, err := k.ctl(0, k.info, unsafe.Pointer(&buf[0])); err != nil {
				res.err = err
				return
			}
			res.left += int(*(*int32)(unsafe.Pointer(&buf[k.inUseOffset])))
		}
	}()
	res := <-done
	if res.err != nil || res.n != 6 || res.left != 0 {
		t.Fatalf("removed %d (want 6), left %d, error %v", res.n, res.left, res.err)
	}
}
