package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// freezeTimeout bounds how long a freeze may take before it is undone and reported.
const freezeTimeout = 5 * time.Second

// Freezer freezes and thaws one sandbox's cgroup by writing the cgroup files directly
// (≈0.2 ms here, against ~ms for a containerd task pause round trip).
type Freezer struct {
	dir string // cgroup directory holding the freezer files and cgroup.procs
	v2  bool
}

// NewFreezer returns the freezer of the cgroup at cgroupsPath (a container's Layout.Cgroup).
func NewFreezer(cgroupsPath string) Freezer {
	if cgroups.Mode() == cgroups.Unified {
		return Freezer{dir: filepath.Join("/sys/fs/cgroup", cgroupsPath), v2: true}
	}
	keepFreezerActive.Do(func() { _ = KeepFreezerActive() })
	return Freezer{dir: filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath)}
}

// keepFreezerActiveCgroup is an empty cgroup v1 freezer cgroup kept frozen (never removed;
// shared by every daemon of the node).
const keepFreezerActiveCgroup = "/sys/fs/cgroup/freezer/deltabox.freezer-active"

var keepFreezerActive sync.Once

// parkCgroup is the cgroup v1 freezer cgroup where Park puts processes (never frozen;
// shared by every daemon of the node).
const parkCgroup = "/sys/fs/cgroup/freezer/deltabox.parked"

// ErrCannotPark: the freezer cannot move a process out of the sandbox's freezing (cgroup v2,
// where the freezer is no hierarchy of its own).
var ErrCannotPark = errors.New("processes can be parked out of the freezer only with cgroup v1")

// Park moves pid (a process of the sandbox the caller holds stopped, such as a process
// template's spare copy) out of the sandbox's freezer cgroup into the node's parking
// cgroup, and only there: on cgroup v1 the freezer is a hierarchy of its own, so the
// process stays in the sandbox's memory, pids and cpu cgroups. A parked process is not
// frozen with the sandbox (so it can be prepared while the sandbox is frozen), nor listed
// by Procs, nor killed by KillAllBut: the caller must Adopt or kill it.
func (f Freezer) Park(pid int) error {
	if f.v2 || !freezerAlone() {
		return ErrCannotPark
	}
	if err := os.Mkdir(parkCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("park process %d: %w", pid, err)
	}
	if err := os.WriteFile(filepath.Join(parkCgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("park process %d: %w", pid, err)
	}
	return nil
}

// freezerAlone reports whether the cgroup v1 freezer is mounted as a hierarchy of its own
// (not with devices, say, whose rules a parked process would then leave).
var freezerAlone = sync.OnceValue(func() bool {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "freezer") {
			return parts[1] == "freezer"
		}
	}
	return false
})

// Adopt moves a parked pid back into the sandbox's freezer cgroup (frozen with it, if it is).
func (f Freezer) Adopt(pid int) error {
	if err := os.WriteFile(filepath.Join(f.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("move process %d into %s: %w", pid, f.dir, err)
	}
	return nil
}

// KeepFreezerActive keeps an empty cgroup v1 freezer cgroup frozen, so that freezing and
// thawing a sandbox never flips the kernel's freezer_active static key: the legacy freezer
// enables it when the first cgroup of the node starts freezing and disables it when the last
// one thaws, and each flip patches the kernel's text on every CPU (measured here: a freeze
// and a thaw of an idle cgroup with 5 processes took ~4 ms each while no other cgroup was
// frozen, 0.1 ms and 0.03 ms with this one frozen). The cost of keeping the key on is the
// freezer's slow-path check where tasks test for freezing (signal delivery), which is
// what a node with any frozen cgroup pays anyway. cgroup v2's freezer has no such key.
func KeepFreezerActive() error {
	if err := os.Mkdir(keepFreezerActiveCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.WriteFile(filepath.Join(keepFreezerActiveCgroup, "freezer.state"), []byte("FROZEN"), 0)
}

// Freeze stops every process of the sandbox and waits until the kernel says it is frozen.
// With cgroup v2 it waits on cgroup.events with poll(2): the kernel signals the file when its
// "frozen" value changes, which wakes the wait within microseconds, where Go's timers (and
// so short sleeps) fire up to a millisecond late.
func (f Freezer) Freeze(ctx context.Context) error {
	if !f.v2 {
		return f.freezeV1(ctx)
	}
	ev, err := os.Open(filepath.Join(f.dir, "cgroup.events"))
	if err != nil {
		return fmt.Errorf("freeze %s: %w", f.dir, err)
	}
	defer ev.Close()
	if err := writeCtl(filepath.Join(f.dir, "cgroup.freeze"), "1"); err != nil {
		return fmt.Errorf("freeze %s: %w", f.dir, err)
	}
	buf := make([]byte, 256)
	deadline := time.Now().Add(freezeTimeout)
	for {
		n, err := ev.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			_ = f.Thaw()
			return fmt.Errorf("freeze %s: read cgroup.events: %w", f.dir, err)
		}
		if bytes.Contains(buf[:n], []byte("frozen 1")) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = f.Thaw()
			return fmt.Errorf("sandbox cgroup %s did not freeze within %s: %w", f.dir, freezeTimeout, errdefs.ErrUnavailable)
		}
		// Wakes on the next change of the file (or after 10 ms, to check ctx and the deadline).
		fds := []unix.PollFd{{Fd: int32(ev.Fd()), Events: unix.POLLPRI}}
		if _, err := unix.Poll(fds, 10); err != nil && !errors.Is(err, unix.EINTR) {
			_ = f.Thaw()
			return fmt.Errorf("freeze %s: poll cgroup.events: %w", f.dir, err)
		}
	}
}

// freezeV1 is Freeze on cgroup v1, whose freezer.state cannot be polled.
func (f Freezer) freezeV1(ctx context.Context) error {
	if err := writeCtl(filepath.Join(f.dir, "freezer.state"), "FROZEN"); err != nil {
		return fmt.Errorf("freeze %s: %w", f.dir, err)
	}
	deadline := time.Now().Add(freezeTimeout)
	for sleep := 20 * time.Microsecond; ; sleep = min(sleep*2, time.Millisecond) {
		frozen, err := f.frozen()
		if err != nil || frozen {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = f.Thaw()
			return fmt.Errorf("sandbox cgroup %s did not freeze within %s: %w", f.dir, freezeTimeout, errdefs.ErrUnavailable)
		}
		nap(sleep)
	}
}

// nap sleeps d. Under a millisecond it blocks the thread in nanosleep(2): the Go runtime's
// timers round such a sleep up to about a millisecond here (its poller waits in whole
// milliseconds), which would make every freeze that is not done at once cost 1 ms frozen.
func nap(d time.Duration) {
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}

func (f Freezer) frozen() (bool, error) {
	if f.v2 {
		data, err := readCtl(filepath.Join(f.dir, "cgroup.events"))
		return bytes.Contains(data, []byte("frozen 1")), err
	}
	data, err := readCtl(filepath.Join(f.dir, "freezer.state"))
	return strings.TrimSpace(string(data)) == "FROZEN", err
}

// Thaw lets the sandbox run again. It is safe to call on a thawed sandbox.
func (f Freezer) Thaw() error {
	file, val := "freezer.state", "THAWED"
	if f.v2 {
		file, val = "cgroup.freeze", "0"
	}
	if err := writeCtl(filepath.Join(f.dir, file), val); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("thaw %s: %w", f.dir, err)
	}
	return nil
}

// Proc identifies a process across pid reuse: host pid plus start time (clock ticks).
type Proc struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Procs lists the sandbox's processes.
func (f Freezer) Procs() ([]Proc, error) { return f.ProcsExcept(nil) }

// ProcsExcept is Procs without the pids in skip, whose start times it does not read (a
// sandbox with process templates holds dozens of stopped processes the caller knows).
func (f Freezer) ProcsExcept(skip map[int]bool) ([]Proc, error) {
	data, err := readCtl(filepath.Join(f.dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("list sandbox processes: %w", err)
	}
	var out []Proc
	for _, field := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(field)
		if err != nil || skip[pid] {
			continue
		}
		if start, err := procStart(pid); err == nil {
			out = append(out, Proc{Pid: pid, Start: start})
		}
	}
	return out, nil
}

// Pinned is a list of a sandbox's processes taken while it may still run (Pin), each process
// held by a pidfd. Once the sandbox is frozen, Procs brings it up to date with one read of
// cgroup.procs, where ProcsExcept reads /proc/PID/stat of each process (40-80 us apiece in a
// loaded frozen window), and Kill signals through its pidfds.
type Pinned struct {
	f         Freezer
	skip      map[int]bool
	procs     map[int]Proc // by pid
	fds       map[int]int  // pidfd by pid
	confirmed map[int]bool // pids whose pidfd's process Procs found a member
}

// Pin lists the sandbox's processes but skip, with a pidfd for each, taken before its start
// time is read: a start time read while the pidfd is open belongs to the pidfd's process if
// that process still exists after the read (a process keeps its pid until it is reaped).
// nil when the list cannot be read (the caller lists with ProcsExcept).
func (f Freezer) Pin(skip map[int]bool) *Pinned {
	data, err := readCtl(filepath.Join(f.dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	p := &Pinned{f: f, skip: skip, procs: map[int]Proc{}, fds: map[int]int{}}
	for _, pid := range p.listed(data) {
		p.add(pid)
	}
	return p
}

// listed returns the pids of a cgroup.procs read, but skip.
func (p *Pinned) listed(data []byte) []int {
	var out []int
	for _, field := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(field); err == nil && !p.skip[pid] {
			out = append(out, pid)
		}
	}
	return out
}

// add pins pid: its pidfd, then its start time. It reports whether the process was there.
func (p *Pinned) add(pid int) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false // gone
	}
	start, err := procStart(pid)
	if err != nil || !exists(fd) {
		unix.Close(fd) // gone: the start time read may be another process's
		return false
	}
	if old, ok := p.fds[pid]; ok {
		unix.Close(old)
	}
	p.procs[pid], p.fds[pid] = Proc{Pid: pid, Start: start}, fd
	return true
}

// exists reports whether the process of a pidfd exists (alive, or dead and not yet reaped).
func exists(pidfd int) bool { return unix.PidfdSendSignal(pidfd, 0, nil, 0) == nil }

// Procs is ProcsExcept(skip) of the frozen sandbox from one read of cgroup.procs: a pid
// listed there whose pinned process still exists after the read is that process (it holds
// the pid), so only processes started since the pinning (or whose pinned process went) are
// pinned now, and confirmed by a second read. Every process returned was a member of the
// cgroup at a read made while its pidfd was open: Kill needs no other check.
func (p *Pinned) Procs() ([]Proc, error) {
	read := func() ([]int, error) {
		data, err := readCtl(filepath.Join(p.f.dir, "cgroup.procs"))
		if err != nil {
			return nil, fmt.Errorf("list sandbox processes: %w", err)
		}
		return p.listed(data), nil
	}
	pids, err := read()
	if err != nil {
		return nil, err
	}
	p.confirmed = map[int]bool{}
	var fresh []int
	for _, pid := range pids {
		if fd, ok := p.fds[pid]; ok && exists(fd) {
			p.confirmed[pid] = true
		} else if p.add(pid) {
			fresh = append(fresh, pid)
		}
	}
	if len(fresh) > 0 {
		again, err := read()
		if err != nil {
			return nil, err
		}
		for _, pid := range fresh {
			if slices.Contains(again, pid) && exists(p.fds[pid]) {
				p.confirmed[pid] = true
			}
		}
	}
	out := make([]Proc, 0, len(p.confirmed))
	for _, pid := range pids {
		if p.confirmed[pid] {
			out = append(out, p.procs[pid])
		}
	}
	return out, nil
}

// Kill is Freezer.Kill for the frozen sandbox: the pids Procs confirmed are signalled through
// their pidfds without another membership check; any other goes through Freezer.Kill.
func (p *Pinned) Kill(pids []int) int {
	n := 0
	var rest []int
	for _, pid := range pids {
		if !p.confirmed[pid] {
			rest = append(rest, pid)
		} else {
			// Dying at idle priority: at the thaw the killed processes are woken to exit
			// and would preempt whoever thaws (on a 2-core machine, the rollback's own
			// thread); as SCHED_IDLE they never preempt on wake-up and die on a core that
			// is free. The pid is the pidfd's: a frozen member cannot exit or be reaped.
			// A process the signal does not reach gets its own policy back. (The call sets
			// the main thread's: other threads of a multi-threaded process keep theirs.)
			was, err := unix.SchedGetAttr(pid, 0)
			if err == nil {
				err = unix.SchedSetAttr(pid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
			}
			if unix.PidfdSendSignal(p.fds[pid], unix.SIGKILL, nil, 0) == nil {
				n++
			} else if err == nil {
				_ = unix.SchedSetAttr(pid, was, 0)
			}
		}
	}
	if len(rest) > 0 {
		n += p.f.Kill(rest)
	}
	return n
}

// Close closes the pidfds.
func (p *Pinned) Close() {
	if p == nil {
		return
	}
	for _, fd := range p.fds {
		unix.Close(fd)
	}
	p.fds, p.confirmed = nil, nil
}

// procStart reads field 22 (starttime) of /proc/PID/stat.
func procStart(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')') // comm may contain spaces and parentheses
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// cgroupPath is the freezer's cgroup as /proc/PID/cgroup names it.
func (f Freezer) cgroupPath() string {
	if f.v2 {
		return strings.TrimPrefix(f.dir, "/sys/fs/cgroup")
	}
	return strings.TrimPrefix(f.dir, "/sys/fs/cgroup/freezer")
}

// member reports whether pid is in the freezer's cgroup or one below it.
func (f Freezer) member(pid int) (bool, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false, err
	}
	want := f.cgroupPath()
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if f.v2 && parts[0] != "0" || !f.v2 && !slices.Contains(strings.Split(parts[1], ","), "freezer") {
			continue
		}
		return parts[2] == want || strings.HasPrefix(parts[2], want+"/"), nil
	}
	return false, nil
}

// pids lists every pid in the cgroup and the cgroups below it (a sandbox may make its own).
func (f Freezer) pids() ([]int, error) {
	var out []int
	err := filepath.WalkDir(f.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p != f.dir && os.IsNotExist(err) { // a child cgroup removed meanwhile
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if p != f.dir && os.IsNotExist(err) {
				return nil
			}
			return err
		}
		for _, field := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(field); err == nil {
				out = append(out, pid)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list sandbox processes in %s: %w", f.dir, err)
	}
	return out, nil
}

// KillAllBut kills every process of the sandbox but keep (its init) through the cgroup, not
// by asking anything inside the sandbox: it freezes the cgroup (nothing forks or escapes a
// scan meanwhile), SIGKILLs each process through a pidfd taken after checking the pid is a
// member (so a reused pid is never signalled), thaws, and waits until only keep is left.
func (f Freezer) KillAllBut(ctx context.Context, keep int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	killed := 0
	for {
		if err := f.Freeze(ctx); err != nil {
			return killed, err
		}
		pids, err := f.pids()
		if err == nil {
			killed += f.killMembers(pids, keep)
		}
		if terr := f.Thaw(); err == nil {
			err = terr
		}
		if err != nil {
			return killed, err
		}
		if left := without(pids, keep); len(left) == 0 {
			return killed, nil
		} else if time.Now().After(deadline) {
			return killed, fmt.Errorf("%d sandbox processes still alive after %s (%v): %w", len(left), timeout, left, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return killed, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Kill SIGKILLs those of pids that are still members of the cgroup, each through a pidfd
// taken before the membership check, so a pid reused by another process is never
// signalled. It returns how many it signalled. Use it instead of kill(2) by number.
func (f Freezer) Kill(pids []int) int { return f.killMembers(pids, 0) }

// killMembers SIGKILLs the pids (but keep) that are still members of the cgroup. Every
// pidfd is taken first, then the cgroup's members are listed once (one read of the cgroup
// tree, where reading /proc/PID/cgroup of each took 40-120 us in a rollback's frozen
// window). A signal through a pidfd reaches its process only while that process lives, and a
// live process holds its pid: so a signal that succeeds went to the process that had the pid
// when the members were listed, which was a member then (only the host moves a process out
// of a sandbox's cgroup).
func (f Freezer) killMembers(pids []int, keep int) int {
	fds := make(map[int]int, len(pids))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, pid := range without(pids, keep) {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil { // else gone
			fds[pid] = fd
		}
	}
	if len(fds) == 0 {
		return 0
	}
	members, err := f.pids()
	if err != nil {
		return 0
	}
	n := 0
	for _, pid := range members {
		if fd, ok := fds[pid]; ok && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			n++
			delete(fds, pid) // a pid listed twice (moved between two cgroups of the walk) counts once
			unix.Close(fd)
		}
	}
	return n
}

func without(pids []int, keep int) []int {
	out := make([]int, 0, len(pids))
	for _, p := range pids {
		if p != keep {
			out = append(out, p)
		}
	}
	return out
}

// writeCtl writes val to the cgroup file path in one write. By hand rather than with
// os.WriteFile, as readCtl: an os.File tries to register with the runtime's poller (an
// epoll_ctl that fails for these files) and carries a finalizer, and a frozen window opens
// four of these files (freeze, its poll, the listing of the processes, thaw).
func writeCtl(path, val string) error {
	fd, err := openCtl(path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for {
		_, err = unix.Write(fd, []byte(val))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// readCtl reads the cgroup file path (see writeCtl).
func readCtl(path string) ([]byte, error) {
	fd, err := openCtl(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

func openCtl(path string, mode int) (int, error) {
	for {
		fd, err := unix.Open(path, mode|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}
