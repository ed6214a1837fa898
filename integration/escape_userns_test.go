package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// The escape suite's user namespace cases (issue 11 point 4): root in a sandbox is an
// unprivileged host uid of a range no other sandbox has, and what host root could do with the
// same capabilities fails.

// TestEscapeUserNamespace: from inside a sandbox as root, the host's view: uid_map shows the
// sandbox's range; a file its root writes to a host-visible bind mount (/.deltabox/run) is
// owned by that unprivileged host uid, as is its init; files of host root and of another
// sandbox's root (a 0600 file placed in its tree) can be neither read nor chowned, though
// CAP_DAC_OVERRIDE and CAP_CHOWN are in its set: the same file is readable by root in a pool
// that opts out (--no-userns), which info, inspect and pool ls show.
func TestEscapeUserNamespace(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 2)
	d.createPool("host", pythonImage, 1, "--no-userns")
	a, b, h := d.lease("py"), d.lease("py"), d.lease("host")
	ma, mb := mappingOf(t, d, a.ID), mappingOf(t, d, b.ID)
	if ma == nil || mb == nil || ma.HostID == mb.HostID || ma.HostID < 1<<28 || ma.Size != 65536 {
		t.Fatalf("sandboxes' mappings %+v and %+v: want two distinct ranges of 65536 from 2^28", ma, mb)
	}
	if got := strings.Fields(d.cli("exec", a.ID, "--", "cat", "/proc/self/uid_map")); strings.Join(got, " ") != fmt.Sprintf("0 %d 65536", ma.HostID) {
		t.Fatalf("uid_map inside: %q", got)
	}

	// a file written by the sandbox's root where the host sees it
	d.cli("exec", a.ID, "--", "sh", "-c", "echo from-root > /.deltabox/run/escape && id -u")
	runDir := hostRunDir(t, d, a.Container)
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(runDir, "escape"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != ma.HostID || st.Gid != ma.HostID {
		t.Fatalf("the host sees the sandbox root's file owned by %d:%d, want %d:%d", st.Uid, st.Gid, ma.HostID, ma.HostID)
	}
	if status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.InitPid)); !strings.Contains(string(status), fmt.Sprintf("Uid:\t%d\t", ma.HostID)) {
		t.Fatalf("the sandbox's init runs as host root or another uid:\n%s", status)
	}

	// files of host root and of the other sandbox's root, placed in the sandbox's tree
	for _, c := range []struct {
		name string
		uid  uint32
	}{{"host-root", 0}, {"other-sandbox", mb.HostID}} {
		plant(t, a.InitPid, c.name, c.uid)
		plant(t, h.InitPid, c.name, c.uid)
		out, errOut, code := d.cliRaw("exec", a.ID, "--", "sh", "-c", "stat -c %u /tmp/"+c.name+"; cat /tmp/"+c.name)
		if code == 0 || strings.Contains(out, "secret") || !strings.Contains(out+errOut, "Permission denied") || !strings.HasPrefix(out, "65534") {
			t.Errorf("%s's 0600 file in a userns sandbox: exit %d, %q %q; want owner 65534 and Permission denied", c.name, code, out, errOut)
		}
		if _, errOut, code := d.cliRaw("exec", a.ID, "--", "chown", "0:0", "/tmp/"+c.name); code == 0 {
			t.Errorf("root in a userns sandbox chowned %s's file: %q", c.name, errOut)
		}
		if out := d.cli("exec", h.ID, "--", "cat", "/tmp/"+c.name); out != "secret\n" {
			t.Errorf("without a user namespace root reads %s's file (CAP_DAC_OVERRIDE): %q", c.name, out)
		}
	}

	// what the operator sees
	var hs api.Sandbox
	d.cliJSON(&hs, "inspect", h.ID)
	if hs.Isolation.UserNamespace || hs.Isolation.IDMapping != nil {
		t.Errorf("inspect of a --no-userns sandbox: %+v", hs.Isolation)
	}
	var pools []api.PoolInfo
	d.cliJSON(&pools, "pool", "ls")
	for _, p := range pools {
		if want := p.Name == "py"; p.Isolation.UserNamespace != want || p.NoUserNamespace == want {
			t.Errorf("pool ls: %s user_namespace %v no_user_namespace %v", p.Name, p.Isolation.UserNamespace, p.NoUserNamespace)
		}
	}
	if out := d.cli("inspect", "-o", "wide", a.ID); !strings.Contains(out, fmt.Sprintf("host ids %d-%d", ma.HostID, ma.HostID+65535)) {
		t.Errorf("inspect does not show the mapping:\n%s", out)
	}
	var info api.Info
	d.cliJSON(&info, "info")
	if !info.Sandbox.Isolation.UserNamespace || info.Sandbox.IDRangeFirst != 1<<28 || info.Sandbox.IDRangeSize != 65536 {
		t.Errorf("info: %+v", info.Sandbox)
	}
}

// TestUserNamespaceL3: L3 works in a user-namespaced pool. A checkpoint dumps the sandbox's
// processes (a counter started by an exec) with its user and network namespaces; a rollback
// restores them in place: the counter goes back to the dumped value and counts on, the files
// written since are gone, the processes run as the same host ids (uid_map), the sandbox keeps
// its address and reaches the egress proxy again (CRIU brings its network namespace back
// without the veth, which the daemon attaches again), and a second rollback to the same
// checkpoint works.
func TestUserNamespaceL3(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, busyboxImage, 1, "")
	l := d.lease("net", noProxyBypass...)
	id := l.ID
	m := mappingOf(t, d, id)
	wantMap := fmt.Sprintf("0 %d %d", m.HostID, m.Size)
	uidMap := func() string {
		return strings.Join(strings.Fields(d.cli("exec", id, "--", "cat", "/proc/self/uid_map")), " ")
	}
	if got := uidMap(); got != wantMap {
		t.Fatalf("uid_map %q, want %q", got, wantMap)
	}
	addr := func() string {
		return d.cli("exec", id, "--", "sh", "-c", "ip -4 -o addr show eth0 | awk '{print $4}'")
	}
	before := addr()
	d.cli("exec", id, "--", "sh", "-c", `sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done' </dev/null >/dev/null 2>&1 &`)
	count := func() int {
		out, _, _ := d.cliRaw("exec", id, "--", "cat", "/tmp/count")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the counter", func() bool { return count() > 5 })
	var ck api.Checkpoint
	d.cliJSON(&ck, "checkpoint", "create", id, "--level", "l3")
	dumped := count()
	for round := 1; round <= 2; round++ {
		testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the counter to pass the checkpoint", func() bool { return count() > dumped+20 })
		d.cli("exec", id, "--", "sh", "-c", "echo after > /tmp/after")
		d.cli("rollback", id, "--to", ck.ID)
		if got := count(); got < dumped-25 || got > dumped+25 {
			t.Fatalf("round %d: counter at %d after the rollback, the checkpoint was taken near %d", round, got, dumped)
		}
		n := count()
		testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the restored counter to count on", func() bool { return count() > n+3 })
		if _, _, code := d.cliRaw("exec", id, "--", "test", "-e", "/tmp/after"); code == 0 {
			t.Fatalf("round %d: /tmp/after survived the rollback", round)
		}
		if got := uidMap(); got != wantMap {
			t.Fatalf("round %d: uid_map after the rollback %q, want %q", round, got, wantMap)
		}
		if got := addr(); got != before {
			t.Fatalf("round %d: address after the rollback %q, before %q", round, got, before)
		}
		if out := d.cli("exec", id, "--", "wget", "-q", "-O", "-", u.plain.URL+"/data"); out != "real body from upstream" {
			t.Fatalf("round %d: egress after the rollback: %q", round, out)
		}
	}
	if got := d.cli("exec", id, "--", "id", "-u"); got != "0\n" {
		t.Fatalf("id -u in the restored sandbox: %q", got)
	}
	// The restored init executed itself again (pool/initd/reexec_linux.go): it serves as
	// before (a detached exec with its output and exit code) and the restored sandbox can be
	// dumped again and rolled back to that.
	gate := "/tmp/gate"
	proc := strings.TrimSpace(d.cli("exec", "-d", id, "sh", "-c", "echo before; while [ ! -e "+gate+" ]; do sleep 0.05; done; echo after; exit 5"))
	d.cli("exec", id, "--", "touch", gate)
	out, errOut, code := d.cliRaw("logs", "-f", id, proc)
	if out != "before\nafter\n" || code != 0 {
		t.Fatalf("logs -f of a detached exec after the rollback: stdout %q stderr %q exit %d", out, errOut, code)
	}
	var ps []api.Proc
	d.cliJSON(&ps, "ps", id)
	if len(ps) != 1 || ps[0].Exit == nil || ps[0].Exit.Code != 5 {
		t.Fatalf("ps after the detached exec ended: %+v, want exit code 5", ps)
	}
	var again api.Checkpoint
	d.cliJSON(&again, "checkpoint", "create", id, "--level", "l3")
	resumed := count()
	testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the counter to pass the second checkpoint", func() bool { return count() > resumed+20 })
	d.cli("rollback", id, "--to", again.ID)
	if got := count(); got < resumed-25 || got > resumed+25 {
		t.Fatalf("counter at %d after the rollback to the second L3 checkpoint, taken near %d", got, resumed)
	}
	if got := uidMap(); got != wantMap {
		t.Fatalf("uid_map after the second rollback %q, want %q", got, wantMap)
	}
	var snap api.Snapshot
	lastJSON(t, d.cli("-o", "json", "snapshot", "push", id), &snap) // a third dump, of an init restored twice
}

func mappingOf(t *testing.T, d *daemon, id string) *api.IDMapping {
	t.Helper()
	var sb api.Sandbox
	d.cliJSON(&sb, "inspect", id)
	if !sb.Isolation.UserNamespace {
		t.Fatalf("sandbox %s has no user namespace: %+v", id, sb.Isolation)
	}
	return sb.Isolation.IDMapping
}

// hostRunDir is the host directory bind-mounted at a sandbox's /.deltabox/run.
func hostRunDir(t *testing.T, d *daemon, cid string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(d.root, "*", "containers", cid, "run"))
	if len(m) != 1 {
		t.Fatalf("run dir of %s under %s: %v", cid, d.root, m)
	}
	return m[0]
}

// plant writes a 0600 file owned by host uid (and gid) uid into a sandbox's /tmp, as host root.
func plant(t *testing.T, initPid uint32, name string, uid uint32) {
	t.Helper()
	p := fmt.Sprintf("/proc/%d/root/tmp/%s", initPid, name)
	if err := os.WriteFile(p, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
}
