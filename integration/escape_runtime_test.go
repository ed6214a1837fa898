package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// The escape suite's runtime cases: a hostile process inside a sandbox tries what a container
// runtime must refuse (issue 11 points 4 and 7).

// probeScript runs one attack per line in Python and prints "name: ok" or "name: errno N".
const probeScript = `import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def sys(name, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    print(name + ": " + ("ok" if r >= 0 else "errno %d" % ctypes.get_errno()))
def sock(name, *args):
    try:
        socket.socket(*args).close()
        print(name + ": ok")
    except OSError as e:
        print(name + ": errno %d" % e.errno)
sys("keyctl", 250, 0, -3, 1)           # KEYCTL_GET_KEYRING_ID of the session keyring, create
sys("add_key", 248, 0, 0, 0, 0, 0)
sys("unshare-user", 272, 0x10000000)   # CLONE_NEWUSER
sys("unshare-mount", 272, 0x00020000)  # CLONE_NEWNS
sock("raw-icmp", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
sock("raw-tcp", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
sock("packet", socket.AF_PACKET, socket.SOCK_RAW, 0x0806)  # ETH_P_ARP: what ARP spoofing needs
`

// probe runs probeScript in sandbox id and returns the result of each probe by name.
func probe(t *testing.T, d *daemon, id string) map[string]string {
	t.Helper()
	out := d.cli("exec", id, "--", "python3", "-c", probeScript)
	res := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		res[k] = v
	}
	return res
}

// TestEscapeSyscallsRefused: the kernel keyring (shared with the host), new user or mount
// namespaces and raw/packet sockets are refused inside a sandbox with EPERM, and the process
// runs under a seccomp filter without CAP_NET_RAW, CAP_SYS_ADMIN or CAP_SYS_PTRACE.
func TestEscapeSyscallsRefused(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	res := probe(t, d, id)
	for _, name := range []string{"keyctl", "add_key", "unshare-user", "unshare-mount", "raw-icmp", "raw-tcp", "packet"} {
		if res[name] != "errno 1" {
			t.Errorf("%s inside the sandbox: got %q, want errno 1 (EPERM)", name, res[name])
		}
	}
	status := d.cli("exec", id, "--", "cat", "/proc/self/status")
	if !strings.Contains(status, "Seccomp:\t2\n") {
		t.Errorf("not under a seccomp filter (want Seccomp: 2):\n%s", status)
	}
	capEff := statusField(t, status, "CapEff")
	for name, bit := range map[string]uint{"CAP_NET_RAW": 13, "CAP_SYS_ADMIN": 21, "CAP_SYS_PTRACE": 19, "CAP_NET_ADMIN": 12, "CAP_SYS_MODULE": 16, "CAP_DAC_READ_SEARCH": 2} {
		if capEff&(1<<bit) != 0 {
			t.Errorf("CapEff %#x has %s", capEff, name)
		}
	}
	if capEff&(1<<0) == 0 { // CAP_CHOWN: the default set is still there
		t.Errorf("CapEff %#x lost CAP_CHOWN", capEff)
	}
	if ping, _, code := d.cliRaw("exec", id, "--", "busybox", "ping", "-c", "1", "-W", "1", "127.0.0.1"); code == 0 {
		t.Errorf("ping (raw ICMP socket) worked inside the sandbox:\n%s", ping)
	}
}

func statusField(t *testing.T, status, name string) uint64 {
	t.Helper()
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":\t"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status:\n%s", name, status)
	return 0
}

// TestEscapeResourceDefaults: a pool that sets no limits gets the node's defaults ([sandbox]
// in the config), enforced by the cgroup and the disk, and shown by pool ls, inspect and info.
func TestEscapeResourceDefaults(t *testing.T) {
	d := startDaemonWith(t, "[sandbox]\ncpus = 1.5\nmemory = \"256m\"\npids = 300\ndisk = \"1g\"\n")
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	if got, want := cgroupLimits(t, d, id), "cpu 150000/100000 memory 268435456 pids 300"; got != want {
		t.Errorf("cgroup limits of the sandbox: got %q, want %q", got, want)
	}
	if kb := rootSizeKB(t, d, id); kb < 900<<10 || kb > 1<<20 {
		t.Errorf("root filesystem of the sandbox is %d KiB, want about 1 GiB", kb)
	}
	want := api.Limits{CPUs: 1.5, MemoryBytes: 256 << 20, Pids: 300, DiskBytes: 1 << 30}
	var ps []api.PoolInfo
	d.cliJSON(&ps, "pool", "ls")
	if len(ps) != 1 || ps[0].Limits != want || ps[0].Isolation.Seccomp == "" || slices.Contains(ps[0].Isolation.Capabilities, "CAP_NET_RAW") {
		t.Errorf("pool ls: %+v, want limits %+v and the isolation", ps, want)
	}
	var sb api.Sandbox
	d.cliJSON(&sb, "inspect", id)
	if sb.Limits != want || sb.Isolation.Seccomp != "containerd-default" || len(sb.Isolation.Capabilities) == 0 {
		t.Errorf("inspect: limits %+v isolation %+v", sb.Limits, sb.Isolation)
	}
	var info api.Info
	d.cliJSON(&info, "info")
	if info.Sandbox.Limits != want || info.Sandbox.Isolation.Seccomp != "containerd-default" {
		t.Errorf("info: %+v", info.Sandbox)
	}
	mustContain(t, "deltabox info", d.cli("info"), "Sandbox seccomp:", "containerd-default", "CAP_CHOWN", "cpus 1.5, memory 256MiB, pids 300, disk 1GiB")
	mustContain(t, "pool ls", d.cli("pool", "ls"), "cpus 1.5, memory 256MiB, pids 300, disk 1GiB")
}

// cgroupFile reads a file of sandbox id's cgroup on the host: the v2 name, or on a v1 host the
// v1 name in the v1 controller's hierarchy.
func cgroupFile(t *testing.T, d *daemon, id, v2, controller, v1 string) string {
	t.Helper()
	var sb api.Sandbox
	d.cliJSON(&sb, "inspect", id)
	path := "/sys/fs/cgroup/deltabox/" + sb.Container + "/" + v2
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
		path = "/sys/fs/cgroup/" + controller + "/deltabox/" + sb.Container + "/" + v1
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// cgroupLimits renders the sandbox's cgroup limits as "cpu QUOTA/PERIOD memory BYTES pids N".
func cgroupLimits(t *testing.T, d *daemon, id string) string {
	t.Helper()
	cpu := strings.Replace(cgroupFile(t, d, id, "cpu.max", "cpu", "cpu.cfs_quota_us"), " ", "/", 1)
	if !strings.Contains(cpu, "/") {
		cpu += "/" + cgroupFile(t, d, id, "cpu.max", "cpu", "cpu.cfs_period_us")
	}
	return fmt.Sprintf("cpu %s memory %s pids %s", cpu, cgroupFile(t, d, id, "memory.max", "memory", "memory.limit_in_bytes"),
		cgroupFile(t, d, id, "pids.max", "pids", "pids.max"))
}

// oomKills is the sandbox cgroup's count of OOM kills.
func oomKills(t *testing.T, d *daemon, id string) int {
	t.Helper()
	for _, line := range strings.Split(cgroupFile(t, d, id, "memory.events", "memory", "memory.oom_control"), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("no oom_kill count in the sandbox's memory cgroup")
	return 0
}

// rootSizeKB is the size of the sandbox's root filesystem as df sees it inside.
func rootSizeKB(t *testing.T, d *daemon, id string) int64 {
	t.Helper()
	out := strings.Fields(d.cli("exec", id, "--", "sh", "-c", "df -k / | tail -1"))
	if len(out) < 2 {
		t.Fatalf("df: %q", out)
	}
	kb, err := strconv.ParseInt(out[1], 10, 64)
	if err != nil {
		t.Fatalf("df: %q", out)
	}
	return kb
}

// limitedPool is a pool with small limits of its own, over generous node defaults.
func limitedPool(t *testing.T) (*daemon, string) {
	d := startDaemonWith(t, "[sandbox]\nmemory = \"2g\"\npids = 4096\ndisk = \"8g\"\n")
	d.createPool("small", pythonImage, 1, "--memory", "96m", "--pids", "64", "--cpus", "0.5", "--disk", "128m")
	return d, d.lease("small").ID
}

// forkBomb forks sleeping children until fork fails and prints how many it made and the errno.
const forkBomb = `import os, time
n, err = 0, 0
while n < 10000:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n, err, flush=True)
os.killpg(0, 9)`

// TestEscapeForkBombBounded: a fork bomb stops at the pool's pids limit (EAGAIN), the daemon
// and the sandbox's init stay alive, and the sandbox works again once it is gone.
func TestEscapeForkBombBounded(t *testing.T) {
	d, id := limitedPool(t)
	if got, want := cgroupLimits(t, d, id), "cpu 50000/100000 memory 100663296 pids 64"; got != want {
		t.Errorf("cgroup limits of the sandbox: got %q, want %q", got, want)
	}
	out, _, _ := d.cliRaw("exec", id, "--", "python3", "-c", forkBomb)
	var n, errno int
	if _, err := fmt.Sscan(out, &n, &errno); err != nil || n >= 64 || n < 10 || errno != 11 {
		t.Fatalf("fork bomb: %q, want fewer than 64 forks then EAGAIN (11)", out)
	}
	testutil.WaitFor(t, 20*time.Second, 100*time.Millisecond, "the sandbox to run commands again", func() bool {
		out, _, code := d.cliRaw("exec", id, "--", "echo", "alive")
		return code == 0 && out == "alive\n"
	})
	d.cli("info")
}

// TestEscapeMemoryHogKilledInside: a process allocating past the pool's memory limit is
// OOM-killed inside the sandbox's cgroup; the init, the sandbox and the daemon live on.
func TestEscapeMemoryHogKilledInside(t *testing.T) {
	d, id := limitedPool(t)
	_, _, code := d.cliRaw("exec", id, "--", "python3", "-c", "b = b'x' * (400 << 20); print(len(b))")
	if code != 137 {
		t.Errorf("memory hog: exit %d, want 137 (SIGKILL by the OOM killer)", code)
	}
	if n := oomKills(t, d, id); n == 0 {
		t.Errorf("no OOM kill counted in the sandbox's cgroup")
	}
	if got := d.cli("exec", id, "--", "echo", "alive"); got != "alive\n" {
		t.Errorf("sandbox after the OOM kill: %q", got)
	}
	d.cli("info")
}

// diskFill writes 1 MiB blocks to path until a write fails and prints the MiB written and
// the errno.
const diskFill = `import os, sys
n, err = 0, 0
with open(sys.argv[1], "wb") as f:
    try:
        while n < 4096:
            f.write(b"x" * (1 << 20)); f.flush(); os.fsync(f.fileno()); n += 1
    except OSError as e:
        err = e.errno
print(n, err)`

// TestEscapeDiskFillENOSPC: writing past the pool's --disk gets ENOSPC inside the sandbox,
// the host's filesystem holds no more than the limit, and a checkpoint of the full sandbox
// is still quick; after the file is removed the sandbox writes again.
func TestEscapeDiskFillENOSPC(t *testing.T) {
	d, id := limitedPool(t)
	before := allocatedBytes(t, d.root)
	out := d.cli("exec", id, "--", "python3", "-c", diskFill, "/big")
	var n, errno int
	if _, err := fmt.Sscan(out, &n, &errno); err != nil || errno != 28 || n > 128 || n < 64 {
		t.Fatalf("disk fill: %q, want 64-128 MiB written then ENOSPC (28)", out)
	}
	// Counted as the blocks allocated under the state root (its own filesystem only, so a
	// sandbox disk's mounted contents are not counted twice), not as the host's free space,
	// which every other process on the machine moves too.
	if used := allocatedBytes(t, d.root) - before; used > 400<<20 {
		t.Errorf("the state root grew by %d MiB for a sandbox limited to 128 MiB", used>>20)
	}
	start := time.Now()
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id)
	if took := time.Since(start); took > 10*time.Second || ck.FrozenMS > 3000 {
		t.Errorf("checkpoint of the full sandbox took %s (frozen %.0f ms)", took, ck.FrozenMS)
	}
	d.cli("exec", id, "--", "rm", "/big")
	if got := d.cli("exec", id, "--", "sh", "-c", "echo ok > /after && cat /after"); got != "ok\n" {
		t.Errorf("write after freeing space: %q", got)
	}
	d.cli("rollback", id, "--to", ck.ID)
	if kb := rootSizeKB(t, d, id); kb > 128<<10 {
		t.Errorf("root filesystem is %d KiB, want at most 128 MiB", kb)
	}
	if n := diskMounts(t, d.root); n == 0 {
		t.Errorf("no sandbox disk mounted for %s", d.root)
	}
	d.cli("pool", "rm", "--force", "small")
	if n := diskMounts(t, d.root); n != 0 {
		t.Errorf("%d sandbox disks still mounted after pool rm", n)
	}
}

// diskMounts counts the loop-mounted filesystems whose image lies under root.
func diskMounts(t *testing.T, root string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		_, src, ok := strings.Cut(line, " - ext4 /dev/")
		if !ok {
			continue
		}
		dev, _, _ := strings.Cut(src, " ")
		backing, _ := os.ReadFile("/sys/block/" + dev + "/loop/backing_file")
		if strings.HasPrefix(string(backing), root+"/") {
			n++
		}
	}
	return n
}

// inNetNS runs a host command inside sandbox id's network namespace, with the host's full
// capabilities: an attacker who got CAP_NET_ADMIN/CAP_NET_RAW in its sandbox.
func inNetNS(t *testing.T, d *daemon, id string, args ...string) (string, error) {
	t.Helper()
	var sb api.Sandbox
	d.cliJSON(&sb, "inspect", id)
	ns := "/run/netns/" + d.net.name + "-" + sb.Container
	out, err := exec.Command("nsenter", append([]string{"--net=" + ns, "--"}, args...)...).CombinedOutput()
	return string(out), err
}

// TestEscapeSpoofedSourceRefused: a sandbox that takes another sandbox's address (its own
// eth0 given the victim's IP, so its ARP requests claim the victim's IP with its own MAC) and
// posts through the egress proxy does not get the request into the victim's journal: the
// bridge drops frames whose source IP or MAC is not the port's own. From its real address
// the same request works, so the path itself is open.
func TestEscapeSpoofedSourceRefused(t *testing.T) {
	testutil.RequiresBinary(t, "nsenter")
	testutil.RequiresBinary(t, "curl")
	u := startUpstream(t)
	d := egressDaemon(t, u, busyboxImage, 2, "")
	victim, attacker := d.lease("net"), d.lease("net")
	proxy := "http://" + d.net.subnet.Addr().Next().String() + ":3128"
	post := func(from string) error {
		out, err := inNetNS(t, d, attacker.ID, "curl", "-sS", "-m", "5", "--interface", from, "-x", proxy, "-X", "POST", "-d", "x=1", u.plain.URL+"/spoofed")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := post(attacker.IP); err != nil {
		t.Fatalf("POST from the attacker's own address: %v", err)
	}
	if _, err := inNetNS(t, d, attacker.ID, "ip", "addr", "add", victim.IP+"/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	_, _ = inNetNS(t, d, attacker.ID, "ip", "neigh", "flush", "all")
	err := post(victim.IP)
	var effects []api.Effect
	d.cliJSON(&effects, "effects", "ls", victim.ID)
	if len(effects) != 0 || err == nil {
		t.Errorf("spoofed POST: error %v, victim's journal %+v (want a failed connection and no effect)", err, effects)
	}
	d.cliJSON(&effects, "effects", "ls", attacker.ID)
	if len(effects) != 1 {
		t.Errorf("attacker's journal: %+v, want its own POST only", effects)
	}
}

// allocatedBytes is what the files under dir allocate on dir's filesystem (st_blocks, each
// inode once); directories on other filesystems (mounted sandbox disks) are not entered.
func allocatedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var top unix.Stat_t
	if err := unix.Lstat(dir, &top); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // removed while walking
				return nil
			}
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return nil // gone meanwhile
		}
		if st.Dev != top.Dev {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}
