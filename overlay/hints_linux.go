//go:build linux

package overlay

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
)

// WritableFiles lists the files the given processes hold open for writing or have mapped
// shared and writable, as paths seen from the processes' root (the sandbox's merged tree).
// Writes through a shared mapping reach the file without any event until its last reference
// goes, so a capture or rollback passes these paths as hints (CaptureRequest.Hints) to be
// stat'ed whatever the change tracker saw. Processes that exit meanwhile are skipped; deleted
// files are left out (nothing of them can be captured).
func WritableFiles(pids []int) []string {
	seen := map[string]bool{}
	var out []string
	add := func(p string) {
		if strings.HasPrefix(p, "/") && !strings.HasSuffix(p, " (deleted)") && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid)
		fds, _ := os.ReadDir(dir + "/fd")
		for _, e := range fds {
			link := dir + "/fd/" + e.Name()
			// The magic link's own mode tells how the file is open: owner write for FMODE_WRITE.
			if fi, err := os.Lstat(link); err == nil && fi.Mode().Perm()&0o200 != 0 {
				if p, err := os.Readlink(link); err == nil {
					add(p)
				}
			}
		}
		if maps, err := os.ReadFile(dir + "/maps"); err == nil {
			for sc := bufio.NewScanner(bytes.NewReader(maps)); sc.Scan(); {
				// address perms offset dev inode pathname
				f := strings.SplitN(sc.Text(), " ", 6)
				if len(f) == 6 && len(f[1]) == 4 && f[1][1] == 'w' && f[1][3] == 's' {
					add(strings.TrimLeft(f[5], " "))
				}
			}
		}
	}
	return out
}
