//go:build linux

package criu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ErrHelperWithUnixSocket is wrapped (with errdefs.ErrFailedPrecondition) into the error of a
// dump refused because CRIU could dump the processes but not restore them: a process holds a
// unix socket bound to a path while CRIU would have to fork a helper task from it (to
// recreate the session or process group of a process whose leader has exited, as every
// double-forked daemon has). CRIU before 4.2 forks such helpers sharing the parent's
// filesystem context, and the parent then cannot enter the mount namespace to bind the
// socket: the restore fails with "Can't setns .../mnt: Invalid argument".
var ErrHelperWithUnixSocket = errors.New("a process that CRIU must fork a session/group helper from holds a path-bound unix socket, which CRIU < 4.2 cannot restore")

// helperFixVersion is the first CRIU that forks helpers without CLONE_FS (criu#2687).
const helperFixVersion = 40200

// inotifyFixVersion is the first CRIU assumed to dump inotify watches on overlayfs; none
// released so far does.
const inotifyFixVersion = 40300

// proc is what the pre-dump check reads of one process of a dumped tree.
type proc struct {
	pid, ppid, pgid, sid int    // host view
	ns                   nsIDs  // the same inside the sandbox's PID namespace
	comm                 string // the process name
}

// nsIDs are a process's pid, process group and session in its innermost PID namespace.
type nsIDs struct{ pid, pgid, sid int }

func (p proc) String() string {
	return fmt.Sprintf("process %d (%s, host pid %d)", p.ns.pid, p.comm, p.pid)
}

// Precheck inspects the process tree rooted at host pid root (the task's init) through /proc
// and refuses, with errdefs.ErrFailedPrecondition and a reason naming the process, shapes that
// the CRIU of st would dump but not restore, or fail to dump with an obscure error:
//   - inotify watches on overlayfs (ErrInotifyOverlay);
//   - a path-bound unix socket in a process CRIU forks a session or group helper from
//     (ErrHelperWithUnixSocket);
//   - TCP and UDP sockets where the kernel refuses SO_PASSCRED on them (ErrInetSockets).
//
// It also reports what the restore needs to know (PrecheckResult). The tree must not change
// while it runs: call it on a paused task.
func Precheck(root int, st Status) (PrecheckResult, error) {
	var res PrecheckResult
	tree, err := readTree(root)
	if err != nil {
		return res, fmt.Errorf("pre-dump check: %w", err)
	}
	if st.Version < inotifyFixVersion {
		for _, p := range tree {
			if err := checkInotify(p); err != nil {
				return res, err
			}
		}
	}
	if st.Version < helperFixVersion {
		if err := checkHelpers(tree, BoundUnixSockets); err != nil {
			return res, err
		}
	}
	if !InetSocketsDumpable(st.Version) {
		if err := checkInet(tree); err != nil {
			return res, err
		}
	}
	res.Processes = len(tree)
	if res.LoopbackTCPOnly, err = loopbackTCPOnly(tree); err != nil {
		return res, fmt.Errorf("pre-dump check: %w", err)
	}
	return res, nil
}

// PrecheckResult is what Precheck learned about a tree it accepts.
type PrecheckResult struct {
	Processes       int
	LoopbackTCPOnly bool // see Meta.LoopbackTCPOnly
}

// readTree returns root and its descendants in depth-first pre-order (CRIU's order), from
// /proc/<pid>/task/*/children.
func readTree(root int) ([]proc, error) {
	var out []proc
	seen := map[int]bool{}
	var walk func(pid int) error
	walk = func(pid int) error {
		if seen[pid] {
			return nil
		}
		seen[pid] = true
		p, err := readProc(pid)
		if gone(err) && pid != root {
			return nil // exited: the task was not paused
		}
		if err != nil {
			return err
		}
		out = append(out, p)
		kids, err := children(pid)
		if gone(err) && pid != root {
			return nil
		}
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := walk(k); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk(root)
}

// gone reports whether a /proc read failed because the process exited: ENOENT when it was
// gone before the open, ESRCH when it exited between the open and the read (a child of the
// tree exiting while the pre-dump check walked it failed the dump with "read
// /proc/N/stat: no such process").
func gone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)
}

// readProc parses /proc/<pid>/stat; comm may hold spaces and parentheses.
func readProc(pid int) (proc, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return proc{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[end+1:]) // state ppid pgrp session ...
	if len(f) < 4 {
		return proc{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	p := proc{pid: pid, comm: s[open+1 : end]}
	p.ppid, _ = strconv.Atoi(f[1])
	p.pgid, _ = strconv.Atoi(f[2])
	p.sid, _ = strconv.Atoi(f[3])
	p.ns = nsIDs{pid: pid, pgid: p.pgid, sid: p.sid}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		p.ns = nsIDsOf(string(b), p.ns)
	}
	return p, nil
}

// nsIDsOf reads the innermost (last) values of the NSpid, NSpgid and NSsid lines of a
// /proc/<pid>/status; def holds the values to keep for missing lines.
func nsIDsOf(status string, def nsIDs) nsIDs {
	for _, line := range strings.Split(status, "\n") {
		key, v, ok := strings.Cut(line, ":")
		f := strings.Fields(v)
		if !ok || len(f) == 0 {
			continue
		}
		n, err := strconv.Atoi(f[len(f)-1])
		if err != nil {
			continue
		}
		switch key {
		case "NSpid":
			def.pid = n
		case "NSpgid":
			def.pgid = n
		case "NSsid":
			def.sid = n
		}
	}
	return def
}

func children(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			if gone(err) {
				continue // the thread exited
			}
			return nil, err
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// checkHelpers finds the processes CRIU 4.1.1 forks helpers from (prepare_pstree_ids) and
// refuses if one of them holds a path-bound unix socket:
//   - for a child of the root in another session that it does not lead: the session leader,
//     or the root when the leader is gone (that helper then also leads the session's group);
//   - for a process group whose leader is gone and that no such session helper leads: the
//     group's first process in CRIU's order.
func checkHelpers(tree []proc, bound func(pid int) ([]string, error)) error {
	if len(tree) == 0 {
		return nil
	}
	root := tree[0]
	byPid := make(map[int]proc, len(tree))
	for _, p := range tree {
		byPid[p.pid] = p
	}
	check := func(parent proc, why string) error {
		socks, err := bound(parent.pid)
		if err != nil || len(socks) == 0 {
			return err
		}
		hint := "start such a server in its own process group and session (setsid, or as an exec's own command rather than `cmd &` in a shell that exits), or use an abstract socket"
		if parent.pid == root.pid {
			hint = "the sandbox's init must be parked (initproto.OpPark) before the dump"
		}
		return fmt.Errorf("%s holds the unix socket bound at %s, and CRIU must fork a helper from it to restore %s: %w (checkpoint-restore/criu#2687); %s: %w",
			parent, socks[0], why, ErrHelperWithUnixSocket, hint, errdefs.ErrFailedPrecondition)
	}
	led := map[int]bool{} // groups led by a session helper or already given a group helper
	for _, p := range tree[1:] {
		if p.ppid != root.pid || p.sid == root.sid || p.sid == p.pid {
			continue
		}
		why := fmt.Sprintf("the session %d of %s, reparented away from its session leader", p.ns.sid, p)
		parent, ok := byPid[p.sid]
		if !ok {
			parent, why = root, fmt.Sprintf("the session %d of %s, whose leader has exited", p.ns.sid, p)
			led[p.sid] = true
		}
		if err := check(parent, why); err != nil {
			return err
		}
	}
	for _, p := range tree[1:] {
		if _, alive := byPid[p.pgid]; alive || p.pgid == p.pid || led[p.pgid] {
			continue
		}
		led[p.pgid] = true
		if err := check(p, fmt.Sprintf("its process group %d, whose leader has exited", p.ns.pgid)); err != nil {
			return err
		}
	}
	return nil
}

// BoundUnixSockets returns the paths of the unix sockets bound to a filesystem path (not
// abstract, not unnamed) that host process pid has open, as listed in pid's network
// namespace.
func BoundUnixSockets(pid int) ([]string, error) {
	inodes, err := socketInodes(pid)
	if err != nil || len(inodes) == 0 {
		return nil, err
	}
	return pathSockets(fmt.Sprintf("/proc/%d/net/unix", pid), inodes)
}

// PathUnixSockets is BoundUnixSockets that also finds the connections pid accepted from
// the caller's network namespace: an accepted socket carries its listener's path but
// belongs to the namespace of the process that connected (the host's, for the host's
// connections to a sandbox's socket), so pid's own table does not list it.
func PathUnixSockets(pid int) ([]string, error) {
	inodes, err := socketInodes(pid)
	if err != nil || len(inodes) == 0 {
		return nil, err
	}
	own, err := pathSockets(fmt.Sprintf("/proc/%d/net/unix", pid), inodes)
	if err != nil {
		return nil, err
	}
	host, err := hostUnixSockets(inodes)
	return append(own, host...), err
}

// hostUnixSockets reads the unix socket table of the caller's own network namespace. Not
// /proc/self/net/unix: that is the namespace of the process's first thread, and a goroutine
// that moved its locked thread into a sandbox's namespace and ended without unlocking it
// (pool/network pins namespaces so) leaves that thread there for good when it was the first
// one (the Go runtime parks the main thread instead of ending it). The table was then the
// sandbox's and the host's connections to its init went unseen, so CRIU failed the dump
// ("unix socket not found"). A fresh goroutine runs on a thread no namespace change touched
// (locked threads are discarded or parked, never reused), and /proc/thread-self names it.
func hostUnixSockets(inodes map[string]bool) ([]string, error) {
	type result struct {
		socks []string
		err   error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		socks, err := pathSockets("/proc/thread-self/net/unix", inodes)
		c <- result{socks, err}
	}()
	r := <-c
	return r.socks, r.err
}

// pathSockets returns the paths of the sockets of a /proc/net/unix table whose inodes are
// in inodes and whose address is a filesystem path.
func pathSockets(table string, inodes map[string]bool) ([]string, error) {
	f, err := os.Open(table)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || !strings.HasPrefix(fields[7], "/") {
			continue
		}
		if inodes[fields[6]] {
			out = append(out, fields[7])
		}
	}
	return out, sc.Err()
}

// socketInodes returns the inodes of the sockets pid has open, as decimal strings.
func socketInodes(pid int) (map[string]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if gone(err) {
		return map[string]bool{}, nil // a zombie (or a process gone since the walk) holds no files
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			out[strings.TrimSuffix(ino, "]")] = true
		}
	}
	return out, nil
}

// checkInotify refuses a process with inotify watches on an overlayfs mount.
func checkInotify(p proc) error {
	dir := fmt.Sprintf("/proc/%d/fd", p.pid)
	ents, err := os.ReadDir(dir)
	if gone(err) {
		return nil // a zombie (or a process gone since the walk) holds no files
	}
	if err != nil {
		return fmt.Errorf("pre-dump check: %w", err)
	}
	var overlays map[uint64]string
	for _, e := range ents {
		if link, err := os.Readlink(filepath.Join(dir, e.Name())); err != nil || link != "anon_inode:inotify" {
			continue
		}
		if overlays == nil {
			if overlays, err = overlayDevs(p.pid); err != nil {
				return fmt.Errorf("pre-dump check: %w", err)
			}
		}
		devs, err := inotifyDevs(p.pid, e.Name())
		if err != nil {
			return fmt.Errorf("pre-dump check: %w", err)
		}
		for _, d := range devs {
			if mnt, ok := overlays[d]; ok {
				return fmt.Errorf("%s watches files on the overlayfs mount %s with inotify (fd %s): %w; stop the watcher or take an L1/L2 checkpoint: %w",
					p, mnt, e.Name(), ErrInotifyOverlay, errdefs.ErrFailedPrecondition)
			}
		}
	}
	return nil
}

// inotifyDevs returns the devices (kernel encoding: major<<20 | minor) of the inodes an
// inotify descriptor watches, from the "inotify wd:.. ino:.. sdev:.." lines of its fdinfo.
func inotifyDevs(pid int, fd string) ([]uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "inotify ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "sdev:"); ok {
				if d, err := strconv.ParseUint(v, 16, 64); err == nil {
					out = append(out, d)
				}
			}
		}
	}
	return out, nil
}

// overlayDevs maps the devices of pid's overlayfs mounts (kernel encoding) to their mount
// points, from /proc/<pid>/mountinfo.
func overlayDevs(pid int) (map[uint64]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	out := map[uint64]string{}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options... - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || g[0] != "overlay" {
			continue
		}
		maj, min, ok := strings.Cut(f[2], ":")
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if ok && err1 == nil && err2 == nil {
			out[ma<<20|mi] = f[4]
		}
	}
	return out, nil
}
