package integration

// Escape suite, part "the tenant after you" (issue 11.6): what one lease leaves in a warm
// sandbox outside the overlay (tmpfs, System V IPC, POSIX mqueues, /dev, the run directory)
// is gone before the next lease of the same container; a /dev that cannot be restored makes
// the release discard the sandbox. And the in-sandbox API never forces a rollback, whatever
// the body looks like.

import (
	"strings"
	"testing"
	"time"
)

// residue lists, from inside a sandbox, what TestEscapeTenantResidue's writer leaves.
const residue = `cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem | grep -v '^ *key' | sed 's/^/ipc: /'
ls -A /dev/shm /run /tmp /dev/mqueue | grep -v ':$' | grep . | sed 's/^/file: /'
ls /dev/x /.deltabox/run/x 2>/dev/null | sed 's/^/file: /'
true`

func TestEscapeTenantResidue(t *testing.T) {
	d := startDaemon(t)
	d.createPool("one", pythonImage, 1, "--max", "1")
	a := d.lease("one")
	d.copyIn(a.ID, "tenant_write.py", "/root/w.py")
	if out := d.cli("exec", a.ID, "--", "python3", "/root/w.py"); out != "written\n" {
		t.Fatalf("tenant A: %q", out)
	}
	before := d.cli("exec", a.ID, "--", "sh", "-c", residue)
	for _, want := range []string{"ipc: ", "file: x", "file: d", "file: rootlink", "file: /dev/x", "file: /.deltabox/run/x"} {
		if !strings.Contains(before, want) {
			t.Fatalf("tenant A's residue is not visible to the check (want %q):\n%s", want, before)
		}
	}
	start := time.Now()
	d.cli("release", a.ID)
	d.waitReady("one", 1, 30*time.Second)
	t.Logf("release to ready: %v", time.Since(start))
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, "tenant residue removed") {
			t.Log(l)
		}
	}
	b := d.lease("one")
	if b.Container != a.Container {
		t.Fatalf("the pool did not reuse the sandbox (container %s, then %s): nothing tested", a.Container, b.Container)
	}
	if after := d.cli("exec", b.ID, "--", "sh", "-c", residue); after != "" {
		t.Fatalf("tenant B of the same container sees tenant A's residue:\n%s", after)
	}
	if out := d.cli("exec", b.ID, "--", "sh", "-c", "test -c /dev/null && ls / | grep -c ."); strings.TrimSpace(out) == "0" {
		t.Fatalf("clearing followed a symlink into the sandbox root: %q", out)
	}
}

// TestEscapeTenantReplacesDevice: tenant A replaces /dev/urandom with a file of its choosing;
// the next tenant must never read it: the sandbox is discarded, not reused. In a user
// namespace (the default) the device nodes are bind mounts of the host's, which the sandbox
// cannot even remove; without one (--no-userns) it can, and the release discards it.
func TestEscapeTenantReplacesDevice(t *testing.T) {
	d := startDaemon(t)
	d.createPool("userns", busyboxImage, 1, "--max", "1")
	u := d.lease("userns")
	if _, errOut, code := d.cliRaw("exec", u.ID, "--", "sh", "-c", "rm /dev/urandom"); code == 0 || !strings.Contains(errOut, "busy") {
		t.Fatalf("rm /dev/urandom in a user namespace: exit %d, %q; want it refused (a bind mount)", code, errOut)
	}
	d.createPool("one", busyboxImage, 1, "--max", "1", "--no-userns")
	a := d.lease("one")
	d.cli("exec", a.ID, "--", "sh", "-c", "rm /dev/urandom && echo 0000000000000000 > /dev/urandom")
	d.cli("release", a.ID)
	d.waitReady("one", 1, 60*time.Second)
	b := d.lease("one")
	if b.Container == a.Container {
		t.Fatalf("container %s with a replaced /dev/urandom was reused", a.Container)
	}
	if out := d.cli("exec", b.ID, "--", "sh", "-c", "test -c /dev/urandom && echo device"); out != "device\n" {
		t.Fatalf("next tenant's /dev/urandom: %q", out)
	}
}

// TestEscapeSelfAPIForce: from inside a real sandbox no spelling of a rollback body (a second
// JSON value, trailing bytes, a duplicate or differently cased key) forces a rollback past a
// commit; the plain rollback after the commit still works.
func TestEscapeSelfAPIForce(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	script := `
import http.client, socket
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("/.deltabox/run/api.sock")
def call(path, body):
    c = C("localhost")
    c.request("POST", path, body=body)
    return c.getresponse().status
print(call("/v1/self/checkpoints", "{}"))
print(call("/v1/self/checkpoints", "{}"))
for body in ['{"to":"1","force":false} {"to":"1","force":true}', '{"to":"1","force":true}x',
             '{"to":"1","force":false,"force":true}', '{"to":"1","Force":true}', '{"to":"1","FORCE":true}']:
    print(call("/v1/self/rollback", body))
`
	if out := d.cli("exec", id, "--", "python3", "-c", script); out != "200\n200\n400\n400\n412\n412\n412\n" {
		t.Fatalf("checkpoints, then rollback bodies from inside: %q", out)
	}
	d.cli("commit", id)
	// Checkpoint 1 is now before the commit: none of the bodies above may reach it.
	out := d.cli("exec", id, "--", "python3", "-c", script)
	if out != "200\n200\n400\n400\n412\n412\n412\n" {
		t.Fatalf("after a commit, rollback bodies from inside: %q", out)
	}
	cks := d.checkpointIDs(id)
	if len(cks) == 0 || cks[0] != "1" || len(cks) < 5 {
		t.Fatalf("checkpoints %v: a forced rollback from inside discarded some", cks)
	}
}
