//go:build linux

package initd

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStat is what the init needs from /proc/PID/stat.
type procStat struct {
	pid, ppid, pgid, sid int
	state                byte
}

// live reports whether the process still runs (zombies and dead entries do not).
func (p procStat) live() bool { return p.state != 'Z' && p.state != 'X' }

// scanProcs reads the stat of every process visible in procDir. Processes that vanish while
// scanning are skipped.
func scanProcs(procDir string) ([]procStat, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", procDir, err)
	}
	out := make([]procStat, 0, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(procDir, pid); err == nil {
			out = append(out, st)
		}
	}
	return out, nil
}

func readStat(procDir string, pid int) (procStat, error) {
	b, err := os.ReadFile(procDir + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(pid, b)
}

// parseStat parses a /proc/PID/stat line; comm may hold spaces and parentheses, so the
// fields start after the last ')'.
func parseStat(pid int, b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, fmt.Errorf("malformed stat of pid %d", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 4 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed stat of pid %d", pid)
	}
	st := procStat{pid: pid, state: f[0][0]}
	var err1, err2, err3 error
	st.ppid, err1 = strconv.Atoi(f[1])
	st.pgid, err2 = strconv.Atoi(f[2])
	st.sid, err3 = strconv.Atoi(f[3])
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, fmt.Errorf("malformed stat of pid %d", pid)
	}
	return st, nil
}

// hasEnv reports whether the environment of pid contains the exact entry kv.
func hasEnv(procDir string, pid int, kv string) bool {
	b, err := os.ReadFile(procDir + "/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for _, e := range bytes.Split(b, []byte{0}) {
		if string(e) == kv {
			return true
		}
	}
	return false
}

// descendsFrom reports whether pid's parent chain (through parents) reaches one of roots.
func descendsFrom(pid int, parents map[int]int, roots map[int]bool) bool {
	for i := 0; i < 4096 && pid > 0; i++ {
		if roots[pid] {
			return true
		}
		next, ok := parents[pid]
		if !ok || next == pid {
			return false
		}
		pid = next
	}
	return false
}
