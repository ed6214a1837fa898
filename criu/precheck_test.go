//go:build linux

package criu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// tree builds a process tree from "pid ppid pgid sid" quadruples; the first is the root.
func tree(rows ...[4]int) []proc {
	out := make([]proc, 0, len(rows))
	for _, r := range rows {
		p := proc{pid: r[0], ppid: r[1], pgid: r[2], sid: r[3], comm: "p"}
		p.ns = nsIDs{pid: r[0], pgid: r[2], sid: r[3]}
		out = append(out, p)
	}
	return out
}

func socketsAt(m map[int]string) func(int) ([]string, error) {
	return func(pid int) ([]string, error) {
		if s, ok := m[pid]; ok {
			return []string{s}, nil
		}
		return nil, nil
	}
}

func TestCheckHelpers(t *testing.T) {
	cases := []struct {
		name    string
		tree    []proc
		sockets map[int]string
		refuse  string // "" accepts; else the process named
	}{
		{"daemon under a listening init", tree([4]int{1, 0, 1, 1}, [4]int{8, 1, 7, 7}), map[int]string{1: "/run/init.sock"}, "process 1 (p"},
		{"daemon under a parked init", tree([4]int{1, 0, 1, 1}, [4]int{8, 1, 7, 7}), nil, ""},
		{"daemonized unix server: the session helper leads its group",
			tree([4]int{1, 0, 1, 1}, [4]int{8, 1, 7, 7}, [4]int{9, 8, 7, 7}), map[int]string{9: "/tmp/s.sock"}, ""},
		{"server started as cmd & from a shell that exited",
			tree([4]int{1, 0, 1, 1}, [4]int{9, 1, 5, 1}), map[int]string{9: "/tmp/s.sock"}, "process 9 (p"},
		{"only the group's first process forks the helper",
			tree([4]int{1, 0, 1, 1}, [4]int{9, 1, 5, 1}, [4]int{10, 1, 5, 1}), map[int]string{10: "/tmp/s.sock"}, ""},
		{"session leader alive, member reparented to init",
			tree([4]int{1, 0, 1, 1}, [4]int{7, 1, 7, 7}, [4]int{8, 1, 8, 7}), map[int]string{7: "/tmp/l.sock"}, "process 7 (p"},
		{"ordinary tree", tree([4]int{1, 0, 1, 1}, [4]int{5, 1, 5, 1}, [4]int{6, 5, 5, 1}), map[int]string{1: "/run/init.sock", 6: "/tmp/x"}, ""},
	}
	for _, c := range cases {
		err := checkHelpers(c.tree, socketsAt(c.sockets))
		if c.refuse == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", c.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrHelperWithUnixSocket) || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), c.refuse) {
			t.Errorf("%s: want ErrHelperWithUnixSocket naming %q, got %v", c.name, c.refuse, err)
		}
	}
}

func TestProcAddresses(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1B5F":                         "127.0.0.1:7007",
		"0229D70A:0050":                         "10.215.41.2:80",
		"00000000000000000000000001000000:0016": "[::1]:22",
		"0000000000000000FFFF00000100007F:1B5F": "127.0.0.1:7007",
	} {
		if got := procAddr(in); got != want {
			t.Errorf("procAddr(%s) = %s, want %s", in, got, want)
		}
	}
	if !procLoopback("0100007F:1B5F") || procLoopback("0229D70A:0050") || !procLoopback("00000000000000000000000001000000:0016") {
		t.Error("procLoopback misreads loopback addresses")
	}
}

func TestNSIDsOf(t *testing.T) {
	status := "Name:\tsh\nNSpid:\t12093\t8\nNSpgid:\t12092\t7\nNSsid:\t12092\t7\n"
	if got := nsIDsOf(status, nsIDs{1, 2, 3}); got != (nsIDs{8, 7, 7}) {
		t.Errorf("nsIDsOf = %+v", got)
	}
	if got := nsIDsOf("Name:\tsh\n", nsIDs{1, 2, 3}); got != (nsIDs{1, 2, 3}) {
		t.Errorf("nsIDsOf without NS lines = %+v", got)
	}
}

// A process that exits (and is reaped) between the walk of the tree and the look at its fds
// holds nothing: the checks pass over it instead of failing the dump (seen as "pre-dump check:
// open /proc/N/fd: no such file or directory"). A zombie's fds are an empty list.
func TestPrecheckToleratesVanishedProcesses(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	testutil.WaitFor(t, 5*time.Second, time.Millisecond, "the child to become a zombie", func() bool {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err == nil && strings.Contains(string(st), ") Z ")
	})
	check := func(state string) {
		if err := checkInotify(proc{pid: pid, comm: "true"}); err != nil {
			t.Fatalf("inotify check of a %s process: %v", state, err)
		}
		if socks, err := socketInodes(pid); err != nil || len(socks) != 0 {
			t.Fatalf("sockets of a %s process: %v, %v", state, socks, err)
		}
	}
	check("zombie")
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	check("reaped")
}

// TestGoneProcess: a /proc read of a process that exited between the open and the read fails
// with ESRCH (os.ReadFile's "read /proc/N/stat: no such process"), and counts as gone like
// ENOENT; other errors do not.
func TestGoneProcess(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&fs.PathError{Op: "read", Path: "/proc/1/stat", Err: unix.ESRCH}, true},
		{&fs.PathError{Op: "open", Path: "/proc/1/stat", Err: unix.ENOENT}, true},
		{&fs.PathError{Op: "open", Path: "/proc/1/stat", Err: unix.EACCES}, false},
	} {
		if got := gone(c.err); got != c.want {
			t.Errorf("gone(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
