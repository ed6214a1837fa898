package integration

import (
	"strconv"
	"strings"
	"testing"
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
