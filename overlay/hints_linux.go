//go:build linux

package overlay

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
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
// (nothing of them can be captured).
func WritableFiles(pids []int) OpenFiles {
	var out OpenFiles
	seen := map[string]bool{}
	add := func(list *[]string, p string) {
		if strings.HasPrefix(p, "/") && !strings.HasSuffix(p, " (deleted)") && !seen[p] {
			seen[p] = true
			*list = append(*list, p)
		}
	}
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid)
		if maps, err := os.ReadFile(dir + "/maps"); err == nil {
			for sc := bufio.NewScanner(bytes.NewReader(maps)); sc.Scan(); {
				// address perms offset dev inode pathname
				f := strings.SplitN(sc.Text(), " ", 6)
				if len(f) == 6 && len(f[1]) == 4 && f[1][1] == 'w' && f[1][3] == 's' {
					add(&out.Mapped, strings.TrimLeft(f[5], " "))
				}
			}
		}
		fds, _ := os.ReadDir(dir + "/fd")
		for _, e := range fds {
			link := dir + "/fd/" + e.Name()
			// The magic link's own mode tells how the file is open: owner write for FMODE_WRITE.
			if fi, err := os.Lstat(link); err == nil && fi.Mode().Perm()&0o200 != 0 {
				if p, err := os.Readlink(link); err == nil {
					add(&out.Writable, p)
				}
			}
		}
	}
	return out
}
