package proctpl

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Huge pages for templates.
//
// A template is a fork, and a fork copies the page tables of the process: one entry per 4
// KiB page, each with its page's reference counts to raise (a 50 MB heap: 12,800 of them,
// ~1.6 ms here, the largest part of a checkpoint's frozen window), and the copies forked
// from the template later pay it again. A region mapped by a 2 MiB huge page is one entry.
// Before its first template, a process's memory is its own (no template shares it yet), so
// its dense anonymous regions can be collapsed into huge pages (MADV_COLLAPSE, asked of the
// process from outside with process_madvise) without costing memory: every 4 KiB page of
// such a region is present and mapped by this process alone, so the huge page replaces
// exactly what it copies. Its templates and their copies then share the huge pages; a write
// after the fork splits only the written region's mapping in the writer (the kernel copies
// the 4 KiB page written), so templates still cost only what diverges.
//
// Nothing changes for the process but the size of its pages: the contents, addresses and
// protections stay. A region the process asked not to be huge (MADV_NOHUGEPAGE, or
// PR_SET_THP_DISABLE) is refused by the kernel and left as it is.

const (
	hugeSize      = 2 << 20 // a PMD-mapped page on x86-64
	pagesPerHuge  = hugeSize / 4096
	madvCollapse  = 25      // MADV_COLLAPSE (linux/mman.h, 6.1+)
	pmPresent     = 1 << 63 // /proc/PID/pagemap: page present
	pmFileShared  = 1 << 61 // file-backed or shared anonymous
	pmExclusive   = 1 << 56 // mapped by this process alone
	collapseChunk = 8       // regions per process_madvise call (a deadline is checked between calls)
)

// HugeResult is what CollapseHuge did.
type HugeResult struct {
	Dense     int // 2 MiB regions that qualified (present, anonymous, exclusive)
	Collapsed int // of which the kernel collapsed (or found huge already)
}

// CollapseHuge collapses into huge pages the dense, exclusively mapped, private anonymous 2
// MiB regions of the process pidfd refers to (pid is its pid, to read its /proc entries),
// until deadline. Call it before the process's first template (see above); it works on a
// running process (the kernel takes its memory map's lock). Failures of single regions are
// not errors (the kernel refuses some, e.g. one a fault is racing); a process that exits is.
func CollapseHuge(pidfd, pid int, deadline time.Time) (HugeResult, error) {
	var res HugeResult
	regions, err := denseRegions(pid)
	if err != nil {
		return res, err
	}
	res.Dense = len(regions)
	for i := 0; i < len(regions) && time.Now().Before(deadline); {
		batch := regions[i:min(i+collapseChunk, len(regions))]
		n, errno := collapse(pidfd, batch)
		if errno == unix.ESRCH {
			return res, fmt.Errorf("process %d exited", pid)
		}
		if errno == unix.ENOSYS {
			return res, fmt.Errorf("collapse the memory of process %d: %w", pid, errno)
		}
		// process_madvise stops at the first region the kernel refuses (EINVAL for one the
		// process marked MADV_NOHUGEPAGE, EAGAIN for one a fault raced): it is skipped.
		done := n / hugeSize
		res.Collapsed += done
		i += done
		if done < len(batch) {
			i++
		}
	}
	return res, nil
}

// remoteIovec is struct iovec for addresses in another process (never dereferenced here).
type remoteIovec struct{ base, len uint64 }

// collapse asks the kernel to collapse the huge-page regions at addrs of the process pidfd
// refers to; it returns the bytes advised (process_madvise stops at the first failure).
func collapse(pidfd int, addrs []uint64) (int, unix.Errno) {
	iov := make([]remoteIovec, len(addrs))
	for i, a := range addrs {
		iov[i] = remoteIovec{base: a, len: hugeSize}
	}
	n, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd), uintptr(unsafe.Pointer(&iov[0])),
		uintptr(len(iov)), madvCollapse, 0, 0)
	return int(n), errno
}

// denseRegions lists the 2 MiB-aligned regions of pid's private anonymous writable mappings
// whose every page is present and mapped by pid alone.
func denseRegions(pid int) ([]uint64, error) {
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer maps.Close()
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	var out []uint64
	buf := make([]byte, pagesPerHuge*8)
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		lo, hi, ok := anonRange(sc.Text())
		if !ok {
			continue
		}
		for addr := (lo + hugeSize - 1) &^ (hugeSize - 1); addr+hugeSize <= hi; addr += hugeSize {
			if _, err := pm.ReadAt(buf, int64(addr/4096*8)); err != nil {
				break
			}
			if allExclusive(buf) {
				out = append(out, addr)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// anonRange parses a /proc/PID/maps line and returns the range of a private anonymous
// writable mapping of at least one huge page (the heap's included; the stack left out).
func anonRange(line string) (lo, hi uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 || f[1] != "rw-p" || f[4] != "0" || len(f) > 6 || len(f) == 6 && f[5] != "[heap]" {
		return 0, 0, false
	}
	a, b, found := strings.Cut(f[0], "-")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(a, 16, 64)
	hi, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || hi-lo < hugeSize {
		return 0, 0, false
	}
	return lo, hi, true
}

// allExclusive reports whether every pagemap entry in buf is a present, private anonymous
// page mapped by this process alone.
func allExclusive(buf []byte) bool {
	for i := 0; i+8 <= len(buf); i += 8 {
		e := binary.NativeEndian.Uint64(buf[i:])
		if e&pmPresent == 0 || e&pmFileShared != 0 || e&pmExclusive == 0 {
			return false
		}
	}
	return true
}

// ErrNoHugePages: the kernel does not collapse memory here (transparent huge pages off).
var ErrNoHugePages = errors.New("transparent huge pages are off on this node")

// HugePagesUsable reports whether MADV_COLLAPSE can work on this node: transparent huge
// pages not "never".
func HugePagesUsable() error {
	data, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(data), "[never]") {
		return ErrNoHugePages
	}
	return nil
}
