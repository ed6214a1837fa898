package pool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// leaseOne creates pool name from t and leases one sandbox of it.
func leaseOne(t *testing.T, m *Manager, tmpl Template) Sandbox {
	t.Helper()
	ctx := context.Background()
	if _, err := m.CreatePool(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	res, err := m.Lease(ctx, tmpl.Name, LeaseRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := m.Get(res.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func execOut(t *testing.T, m *Manager, id string, argv ...string) string {
	t.Helper()
	var out bytes.Buffer
	st, err := m.Exec(context.Background(), id, ExecRequest{Argv: argv}, nil, &out, &out)
	if err != nil || st.Code != 0 {
		t.Fatalf("exec %q: %v %+v %q", argv, err, st, out.String())
	}
	return strings.TrimSpace(out.String())
}

// TestUserNamespaceMapsRoot: a sandbox's root is an unprivileged host uid of a range of its
// own; uid_map shows it; what root writes is owned by that uid on the host.
func TestUserNamespaceMapsRoot(t *testing.T) {
	m := newTestManager(t, t.TempDir())
	defer removeAll(t, m)
	a := leaseOne(t, m, Template{Name: "a", Image: busybox, MinReady: 1, Max: 2})
	b := leaseOne(t, m, Template{Name: "b", Image: busybox, MinReady: 0, Max: 2})
	for _, sb := range []Sandbox{a, b} {
		if !sb.Isolation.UserNamespace || sb.Isolation.IDMapping == nil {
			t.Fatalf("sandbox %s: isolation %+v, want a user namespace with a mapping", sb.ID, sb.Isolation)
		}
	}
	ma, mb := *a.Isolation.IDMapping, *b.Isolation.IDMapping
	if ma.HostID == mb.HostID || ma.HostID < IDRangeFirst || ma.Size != IDRangeSize {
		t.Fatalf("mappings %v and %v: want distinct ranges of %d from %d", ma, mb, IDRangeSize, IDRangeFirst)
	}
	want := fmt.Sprintf("0 %d %d", ma.HostID, ma.Size)
	if got := strings.Join(strings.Fields(execOut(t, m, a.ID, "cat", "/proc/self/uid_map")), " "); got != want {
		t.Fatalf("uid_map %q, want %q", got, want)
	}
	if got := execOut(t, m, a.ID, "sh", "-c", "id -u; echo x > /root-file; stat -c %u:%g /root-file"); got != "0\n0:0" {
		t.Fatalf("inside: %q", got)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sb0Upper(t, m, a), "root-file"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != ma.HostID || st.Gid != ma.HostID {
		t.Fatalf("host sees %d:%d, want %d:%d", st.Uid, st.Gid, ma.HostID, ma.HostID)
	}
	host, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.InitPid))
	if !strings.Contains(string(host), fmt.Sprintf("Uid:\t%d", ma.HostID)) {
		t.Fatalf("host view of the init: %s", host)
	}
}

func sb0Upper(t *testing.T, m *Manager, sb Sandbox) string {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leased[sb.ID].inst.layout.Upper
}

// TestNoUserNamespacePool: a pool that opts out runs as host root, and says so.
func TestNoUserNamespacePool(t *testing.T) {
	m := newTestManager(t, t.TempDir())
	defer removeAll(t, m)
	sb := leaseOne(t, m, Template{Name: "host", Image: busybox, NoUserNamespace: true})
	if sb.Isolation.UserNamespace || sb.Isolation.IDMapping != nil {
		t.Fatalf("isolation %+v, want none", sb.Isolation)
	}
	p, _ := m.Pool("host")
	if p.Isolation.UserNamespace {
		t.Fatalf("pool isolation %+v", p.Isolation)
	}
	if got := strings.Fields(execOut(t, m, sb.ID, "cat", "/proc/self/uid_map")); len(got) != 3 || got[1] != "0" {
		t.Fatalf("uid_map %q, want the host's", got)
	}
}

// TestUserNamespaceRangeSurvivesRestart: a restarted manager finds its sandboxes' ranges in
// their containers' specs: the adopted sandbox keeps its range and its user namespace, and a
// sandbox created afterwards gets another range.
func TestUserNamespaceRangeSurvivesRestart(t *testing.T) {
	root := t.TempDir()
	m := newTestManager(t, root)
	sb := leaseOne(t, m, Template{Name: "a", Image: busybox, Max: 4})
	before := *sb.Isolation.IDMapping
	m.Close()

	m = newTestManager(t, root)
	defer removeAll(t, m)
	again, err := m.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Isolation.IDMapping; got == nil || *got != before {
		t.Fatalf("after a restart the sandbox's mapping is %v, want %v", got, before)
	}
	if got := execOut(t, m, sb.ID, "cat", "/proc/self/uid_map"); !strings.Contains(got, fmt.Sprint(before.HostID)) {
		t.Fatalf("uid_map after restart: %q", got)
	}
	res, err := m.Lease(context.Background(), "a", LeaseRequest{})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := m.Get(res.ID)
	if other.Isolation.IDMapping == nil || other.Isolation.IDMapping.HostID == before.HostID {
		t.Fatalf("a sandbox made after the restart got %v, the adopted one has %v", other.Isolation.IDMapping, before)
	}
}

// TestOrphanUserNSUnpinnedAtStart: a user namespace pinned for a container that was never made
// (a daemon killed mid-create) is unpinned when the next manager starts.
func TestOrphanUserNSUnpinnedAtStart(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "containers", "dbx-orphan")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(dir, userNSFile)
	if err := pinNS("/proc/self/ns/user", pin); err != nil {
		t.Fatal(err)
	}
	m := newTestManager(t, root)
	defer removeAll(t, m)
	if _, err := os.Lstat(pin); !os.IsNotExist(err) {
		t.Fatalf("the orphan's user namespace is still pinned: %v", err)
	}
}

// pinNS bind-mounts the namespace file from onto a new file at path (what daemons before
// runc made the user namespace left in sandbox directories).
func pinNS(from, path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	return syscall.Mount(from, path, "none", syscall.MS_BIND, "")
}
