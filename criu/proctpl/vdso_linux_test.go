package proctpl

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestSyscallInVDSO: the address found through the auxiliary vector is the one the
// process's memory map gives, for different programs; a process that unmapped its vDSO
// has no address (the auxiliary vector's stale base is not used).
func TestSyscallInVDSO(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, ok := vdsoSyscallOffset(); !ok {
		t.Fatal("no syscall instruction found in the daemon's own vDSO")
	}
	for _, argv := range [][]string{{"/bin/sleep", "100"}, {"/bin/sh", "-c", "read x"}, {"/usr/bin/python3", "-S", "-c", "import time; time.sleep(100)"}} {
		cmd := exec.Command(argv[0], argv[1:]...)
		if argv[0] == "/bin/sh" {
			if _, err := cmd.StdinPipe(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		testutil.WaitFor(t, 5*time.Second, time.Millisecond, argv[0]+" running", func() bool { return procState(pid) == "S" })
		got, err := syscallInVDSO(pid)
		want, werr := syscallInVDSOMaps(pid)
		base, _ := auxvVDSO(pid)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err != nil || werr != nil || got != want || got < base {
			t.Errorf("%s: auxv path %#x (%v), map %#x (%v), base %#x", argv[0], got, err, want, werr, base)
		}
	}

	// A C program (any libc call after the unmap could reach into the vDSO) that unmaps
	// its vDSO, says so and blocks in read(2).
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/novdso.c", []byte(`#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
	char c;
	if (munmap((void *)getauxval(AT_SYSINFO_EHDR), 8192) != 0) return 1;
	write(1, "unmapped\n", 9);
	read(0, &c, 1);
	return 0;
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(testutil.RequiresBinary(t, "gcc"), "-O1", "-o", dir+"/novdso", dir+"/novdso.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	gone := exec.Command(dir + "/novdso")
	if _, err := gone.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, _ := gone.StdoutPipe()
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gone.Process.Kill(); _ = gone.Wait() }()
	buf := make([]byte, 9)
	if _, err := out.Read(buf); err != nil || string(buf) != "unmapped\n" {
		t.Fatalf("python did not unmap its vDSO: %q %v", buf, err)
	}
	if addr, err := syscallInVDSO(gone.Process.Pid); err == nil {
		t.Fatalf("process without a vDSO: syscall address %#x, want an error", addr)
	}
}
