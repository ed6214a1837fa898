package proctpl

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// smapsKB sums a field of /proc/PID/smaps over the mappings that contain addr (0: all).
func smapsKB(t *testing.T, pid int, field string, addr uint64) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	sum, in := 0, addr == 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = addr == 0 || a <= addr && addr < b
				continue
			}
		}
		if in && f[0] == field+":" {
			n, _ := strconv.Atoi(f[1])
			sum += n
		}
	}
	return sum
}

// TestCollapseHuge: the dense private memory of a process (50 MB of heap) becomes huge pages
// with its contents and its resident size unchanged; a sparse mapping and one the process
// marked MADV_NOHUGEPAGE are left alone; and once a template shares the memory nothing is
// collapsed (that would copy what the template shares).
func TestCollapseHuge(t *testing.T) {
	testutil.RequiresRoot(t)
	if err := HugePagesUsable(); err != nil {
		testutil.SkipOrFail(t, "%v", err)
	}
	r := startREPL(t)
	r.eval(t, "import os, mmap, ctypes, hashlib; heap = bytearray(os.urandom(50 << 20)); h = hashlib.sha256(heap).hexdigest()")
	// sparse: 8 MiB with one page in two touched; nohuge: 8 MiB, all touched, MADV_NOHUGEPAGE
	r.eval(t, "priv = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS; sparse = mmap.mmap(-1, 8 << 20, flags=priv); nohuge = mmap.mmap(-1, 8 << 20, flags=priv)")
	r.eval(t, "nohuge.madvise(mmap.MADV_NOHUGEPAGE)")
	r.eval(t, "for i in range(0, 8 << 20, 8192): sparse[i] = 1")
	r.eval(t, "for i in range(0, 8 << 20, 4096): nohuge[i] = 1")
	addrOf := func(name string) uint64 {
		s := r.eval(t, "ctypes.addressof(ctypes.c_char.from_buffer("+name+"))")
		a, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("address of %s: %q", name, s)
		}
		return a
	}
	sparse, nohuge := addrOf("sparse"), addrOf("nohuge")
	pid := r.cmd.Process.Pid
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	rss := smapsKB(t, pid, "Rss", 0)
	start := time.Now()
	res, err := CollapseHuge(fd, pid, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v in %s", res, time.Since(start))
	if res.Dense < 23 || res.Collapsed < 23 { // 50 MB: at least 23 aligned 2 MiB regions
		t.Fatalf("collapsed %d of %d dense regions, want the heap's (>= 23)", res.Collapsed, res.Dense)
	}
	if huge := smapsKB(t, pid, "AnonHugePages", 0); huge < 46<<10 {
		t.Fatalf("AnonHugePages %d kB after the collapse, want the heap's >= %d", huge, 46<<10)
	}
	if after := smapsKB(t, pid, "Rss", 0); after > rss+2<<10 {
		t.Fatalf("resident size grew from %d to %d kB: only dense regions may be collapsed", rss, after)
	}
	if got := smapsKB(t, pid, "AnonHugePages", sparse); got != 0 {
		t.Fatalf("the sparse mapping got %d kB of huge pages", got)
	}
	if got := smapsKB(t, pid, "AnonHugePages", nohuge); got != 0 {
		t.Fatalf("the MADV_NOHUGEPAGE mapping got %d kB of huge pages", got)
	}
	if got := r.eval(t, "hashlib.sha256(heap).hexdigest() == h and sparse[8192] == 1 and sparse[4096] == 0 and nohuge[4096] == 1"); got != "True" {
		t.Fatalf("memory changed by the collapse: %s", got)
	}

	// Shared with a template, the memory is no longer the process's alone: nothing qualifies.
	tr := NewTracer()
	tp := checkpoint(t, tr, pid)
	r.eval(t, "heap2 = bytearray(os.urandom(8 << 20))") // new memory of its own does
	res, err = CollapseHuge(fd, pid, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if res.Dense > 4 {
		t.Fatalf("%d dense regions found in memory shared with a template (want only heap2's, <= 4)", res.Dense)
	}
	// The copies of the template share its huge pages and see the same memory.
	c := rollback(t, tp, pid)
	if got := r.eval(t, "hashlib.sha256(heap).hexdigest() == h"); got != "True" {
		t.Fatalf("the copy's heap differs: %s", got)
	}
	if huge := smapsKB(t, c, "AnonHugePages", 0); huge < 40<<10 {
		t.Fatalf("the copy maps %d kB of huge pages, want the template's (>= %d)", huge, 40<<10)
	}
}
