//go:build linux

package overlay

import (
	"bufio"
	"bytes"
	"errors"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenFiles are files a sandbox's processes may be changing without the kernel reporting it
// to the change tracker, as paths seen from the processes' root (the sandbox's merged tree).
type OpenFiles struct {
	// Writable files are held open for writing: a file written through a mapping that is
	// gone (but whose descriptor is still open) raises its event only when it is closed.
	Writable []string
	// Mapped files are mapped shared and writable: writes through the mapping raise no event
	// while it lives, and only the first write to a clean page moves the file's mtime, so
	// their content can change with their stat unchanged. Captures record them whatever their
	// stat says; rollbacks restore them.
	Mapped []string
}

// all returns both lists.
func (o OpenFiles) all() []string { return append(append([]string(nil), o.Writable...), o.Mapped...) }

// WritableFiles lists the files the given processes hold open for writing or have mapped
// shared and writable. Processes that exit meanwhile are skipped; deleted files are left out
// (nothing of them can be captured). It runs in a frozen window: each process's fd directory
// is opened once and its links are read relative to it, and maps is read in one buffer.
func WritableFiles(pids []int) OpenFiles {
	var out OpenFiles
	seen := map[string]bool{}
	add := func(list *[]string, p string) {
		if strings.HasPrefix(p, "/") && !strings.HasSuffix(p, " (deleted)") && !seen[p] {
			seen[p] = true
			*list = append(*list, p)
		}
	}
	buf := make([]byte, 64<<10)
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid)
		var maps []byte
		if maps, buf = readProcFile(dir+"/maps", buf); maps != nil {
			for sc := bufio.NewScanner(bytes.NewReader(maps)); sc.Scan(); {
				// address perms offset dev inode pathname
				f := strings.SplitN(sc.Text(), " ", 6)
				if len(f) == 6 && len(f[1]) == 4 && f[1][1] == 'w' && f[1][3] == 's' {
					add(&out.Mapped, strings.TrimLeft(f[5], " "))
				}
			}
		}
		fdDir, err := unix.Open(dir+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		names, _ := readDirNames(fdDir)
		for _, n := range names {
			// The magic link's own mode tells how the file is open: owner write for FMODE_WRITE.
			var st unix.Stat_t
			if unix.Fstatat(fdDir, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&0o200 != 0 {
				if p, err := readLinkAt(fdDir, n); err == nil {
					add(&out.Writable, p)
				}
			}
		}
		unix.Close(fdDir)
	}
	return out
}

// readProcFile reads a whole (proc) file into buf, grown as needed; nil when it cannot be
// read. It returns the buffer for the next read.
func readProcFile(path string, buf []byte) ([]byte, []byte) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, buf
	}
	defer unix.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
		m, err := unix.Read(fd, buf[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, buf
		}
		if m == 0 {
			return buf[:n], buf
		}
		n += m
	}
}
