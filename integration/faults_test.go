package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
)

// The fault suite: the daemon is made to die (failpoint "exit", status 137, as kill -9) at a
// named point of checkpoint, rollback, commit and release (internal/failpoint), restarted
// without failpoints, and each case checks the one outcome it must have. One daemon (and
// sandbox) serves each group; it is restarted between cases.

// restartWith stops the daemon (if it runs) and starts it with the failpoints of spec.
func (d *daemon) restartWith(spec string) {
	d.t.Helper()
	if d.cmd != nil {
		d.stop()
	}
	d.extra = nil
	if spec != "" {
		d.extra = []string{"DELTABOX_FAILPOINTS=" + spec}
	}
	d.start()
}

// crashAt runs the CLI command with the daemon armed to die at point, and checks that it
// died there; the daemon is restarted without failpoints.
func (d *daemon) crashAt(point string, args ...string) {
	d.t.Helper()
	d.restartWith(point + "=exit")
	if out, _, code := d.cliRaw(args...); code == 0 {
		d.t.Fatalf("%v succeeded with failpoint %s armed: %s", args, point, out)
	}
	select {
	case err := <-d.exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 137 {
			d.t.Fatalf("daemon exit at %s: %v, want status 137\n%s", point, err, d.logTail())
		}
	case <-time.After(30 * time.Second):
		d.t.Fatalf("daemon did not die at failpoint %s", point)
	}
	d.cmd = nil
	d.restartWith("")
}

func (d *daemon) checkpointIDs(id string) []string {
	d.t.Helper()
	var cks []api.Checkpoint
	d.cliJSON(&cks, "checkpoint", "ls", id)
	out := make([]string, len(cks))
	for i, c := range cks {
		out[i] = c.ID
	}
	return out
}

// checkpointHead returns the checkpoint sandbox id is at (reference @).
func (d *daemon) checkpointHead(id string) string {
	d.t.Helper()
	var cks []api.Checkpoint
	d.cliJSON(&cks, "checkpoint", "ls", id)
	for _, c := range cks {
		if c.Head {
			return c.ID
		}
	}
	d.t.Fatalf("sandbox %s: no head checkpoint in %+v", id, cks)
	return ""
}

func (d *daemon) effectStatus(id, url string) string {
	d.t.Helper()
	var effects []api.Effect
	d.cliJSON(&effects, "effects", "ls", id)
	for _, e := range effects {
		if e.URL == url {
			return e.Status
		}
	}
	return "none"
}

// holdPost makes the sandbox POST to url (held by the proxy).
func (d *daemon) holdPost(id, url string) {
	d.t.Helper()
	if out := d.cli("exec", id, "--", "curl", "-sS", "-m", "10", "-X", "POST", "-d", "x=1", url); !strings.Contains(out, `"held":true`) {
		d.t.Fatalf("POST %s not held: %q", url, out)
	}
}

// TestFaultsRollback: killed at any point after a rollback recorded its intent, the
// rollback is finished at start (files, state, effects, checkpoints, all of them); killed
// before, nothing of it happened. No rolled-back effect is ever sent.
func TestFaultsRollback(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	cases := []struct {
		point string
		done  bool
	}{
		{"rollback/before-intent", false},
		{"rollback/frozen", true},
		{"rollback/after-effects", true},
		{"rollback/after-files", true},
		{"rollback/after-state", true},
		{"rollback/before-clear", true},
		{"rollback/after-thaw", true}, // thawed, the files' record not yet written
	}
	for i, c := range cases {
		t.Run(strings.ReplaceAll(c.point, "/", "-"), func(t *testing.T) {
			d.t = t
			var target api.Checkpoint
			d.cliJSON(&target, "checkpoint", "create", id)
			url := fmt.Sprintf("%s/rolled-back-%d", u.plain.URL, i)
			d.cli("exec", id, "--", "sh", "-c", "echo dirty > /root/step")
			d.cli("state", "patch", id, `[{"op":"add","path":"/step","value":"dirty"}]`)
			d.holdPost(id, url)
			d.cli("checkpoint", "create", id)
			d.crashAt(c.point, "rollback", id, "--to", target.ID)
			_, _, code := d.cliRaw("exec", id, "--timeout", "10s", "--", "test", "-e", "/root/step")
			state := d.stateDoc(id)
			status := d.effectStatus(id, url)
			head := d.checkpointHead(id)
			if c.done {
				if code == 0 || strings.Contains(state, "dirty") || status != "dropped" || head != target.ID {
					t.Fatalf("rollback not finished at start: file exists %v, state %s, effect %s, head %s",
						code == 0, state, status, head)
				}
			} else {
				if code != 0 || !strings.Contains(state, "dirty") || status != "held" || head == target.ID {
					t.Fatalf("rollback killed before its intent changed something: file exists %v, state %s, effect %s, head %s",
						code == 0, state, status, head)
				}
				d.cli("rollback", id, "--to", target.ID)
			}
		})
	}
	d.t = t
	d.cli("commit", id)
	for i := range cases {
		if n := u.count(fmt.Sprintf("POST /rolled-back-%d", i)); n != 0 {
			t.Errorf("rolled-back effect %d reached the upstream %d times", i, n)
		}
	}
}

// TestFaultsRollbackAnswered: a rollback is answered once its record is in place; its
// syncs and the clear of its intent follow. A daemon killed (SIGKILL) after the answer, at
// either of those points, finds at start that the rollback is done: it is not redone, so
// what the sandbox did after the answer (a file, a held effect) stays, and the rollback's
// own outcome (files, state, effects, head) holds.
func TestFaultsRollbackAnswered(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	for i, point := range []string{"rollback/before-sync", "rollback/synced"} {
		t.Run(strings.ReplaceAll(point, "/", "-"), func(t *testing.T) {
			d.t = t
			var target api.Checkpoint
			d.cliJSON(&target, "checkpoint", "create", id)
			url := fmt.Sprintf("%s/rolled-back-answered-%d", u.plain.URL, i)
			d.cli("exec", id, "--", "sh", "-c", "echo dirty > /root/step")
			d.cli("state", "patch", id, `[{"op":"add","path":"/step","value":"dirty"}]`)
			d.holdPost(id, url)
			d.cli("checkpoint", "create", id)
			d.restartWith(point + "=sleep(5000)") // the daemon is killed in the sleep
			d.cli("rollback", id, "--to", target.ID)
			after := fmt.Sprintf("%s/after-answer-%d", u.plain.URL, i)
			d.cli("exec", id, "--", "sh", "-c", "echo kept > /root/after")
			d.holdPost(id, after)
			d.kill()
			d.restartWith("")
			_, _, stepCode := d.cliRaw("exec", id, "--timeout", "10s", "--", "test", "-e", "/root/step")
			kept := strings.TrimSpace(d.cli("exec", id, "--", "cat", "/root/after"))
			state, status, head := d.stateDoc(id), d.effectStatus(id, url), d.checkpointHead(id)
			if stepCode == 0 || strings.Contains(state, "dirty") || status != "dropped" || head != target.ID {
				t.Fatalf("rollback not done after the restart: file exists %v, state %s, effect %s, head %s",
					stepCode == 0, state, status, head)
			}
			if kept != "kept" || d.effectStatus(id, after) != "held" {
				t.Fatalf("the restart redid an answered rollback: file written after it %q, effect held after it %s",
					kept, d.effectStatus(id, after))
			}
		})
	}
	d.t = t
	d.cli("rollback", id) // drop the effects held after the answers
	d.cli("commit", id)
	for i := range 2 {
		if n := u.count(fmt.Sprintf("POST /rolled-back-answered-%d", i)); n != 0 {
			t.Errorf("rolled-back effect %d reached the upstream %d times", i, n)
		}
	}
}

// TestFaultsCommit: killed before the commit point is recorded, nothing was committed;
// killed after, the commit point stays moved and start-up finishes the commit, each effect
// reaching the upstream once, always with its one key.
func TestFaultsCommit(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	cases := []struct {
		point string
		moved bool
	}{
		{"commit/before-record", false},
		{"commit/before-send", true},
		{"commit/after-send", true},
	}
	for i, c := range cases {
		t.Run(strings.ReplaceAll(c.point, "/", "-"), func(t *testing.T) {
			d.t = t
			path := fmt.Sprintf("/committed-%d", i)
			d.holdPost(id, u.plain.URL+path)
			var ck api.Checkpoint
			d.cliJSON(&ck, "checkpoint", "create", id)
			d.crashAt(c.point, "commit", id)
			var cks []api.Checkpoint
			d.cliJSON(&cks, "checkpoint", "ls", id)
			committed := cks[len(cks)-1].Committed
			if !c.moved {
				if committed || u.count("POST "+path) != 0 || d.effectStatus(id, u.plain.URL+path) != "held" {
					t.Fatalf("commit killed before it recorded its point: committed %v, sent %d, effect %s",
						committed, u.count("POST "+path), d.effectStatus(id, u.plain.URL+path))
				}
				d.cli("commit", id)
			} else {
				_, errOut, code := d.cliRaw("rollback", id, "--to", ck.ID)
				if !committed || code == 0 || !strings.Contains(errOut, "commit") {
					t.Fatalf("commit point after the crash: committed %v, rollback across it: %d %s", committed, code, errOut)
				}
			}
			testutil.WaitFor(t, 20*time.Second, 20*time.Millisecond, "the resumed commit", func() bool {
				return d.effectStatus(id, u.plain.URL+path) == "released"
			})
			u.mu.Lock()
			keys := u.keys["POST "+path]
			u.mu.Unlock()
			if len(keys) != 1 || !strings.HasPrefix(keys[0], "deltabox-") {
				t.Fatalf("upstream saw the effect with keys %q, want once with a deltabox- key", keys)
			}
		})
	}
	d.t = t
}

// TestFaultsRelease: a release killed after the pool released the sandbox leaves no effect
// journal or session state behind after the next start.
func TestFaultsRelease(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	d.holdPost(id, u.plain.URL+"/released")
	journal := filepath.Join(d.root, "proxy", "journal", id+".journal")
	if _, err := os.Stat(journal); err != nil {
		t.Fatalf("no journal before release: %v", err)
	}
	os.MkdirAll(filepath.Join(d.root, "restore", "snap-interrupted"), 0o700)
	os.MkdirAll(filepath.Join(d.root, "criu-work", "dump-interrupted"), 0o700)
	d.crashAt("release/before-forget", "release", id)
	for _, p := range []string{journal, filepath.Join(d.root, "sandboxes", id),
		filepath.Join(d.root, "restore", "snap-interrupted"), filepath.Join(d.root, "criu-work", "dump-interrupted")} {
		testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, p+" to be swept", func() bool {
			_, err := os.Stat(p)
			return os.IsNotExist(err)
		})
	}
	if n := u.count("POST /released"); n != 0 {
		t.Errorf("effect of a released sandbox sent %d times", n)
	}
}

// TestFaultsHungUpstream: a commit whose upstream never answers blocks neither the
// sandbox's other operations nor, after a restart, the API.
func TestFaultsHungUpstream(t *testing.T) {
	u := startUpstream(t)
	hang := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); hung.Close() })
	d := egressDaemon(t, u, pythonImage, 1, "")
	t.Cleanup(func() {
		if d.cmd != nil {
			d.kill() // a stop would wait for the hung commit
		}
	})
	id := d.lease("net", noProxyBypass...).ID
	d.holdPost(id, hung.URL+"/never")
	d.cli("checkpoint", "create", id)
	go d.cliRaw("commit", id)
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the commit to start sending", func() bool {
		return d.effectStatus(id, hung.URL+"/never") == "sending"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := d.client()
	ck, err := c.Checkpoint(ctx, id, api.CheckpointRequest{})
	if err != nil {
		t.Fatalf("checkpoint during a hung commit: %v", err)
	}
	d.cli("state", "patch", id, `[{"op":"add","path":"/during","value":1}]`)
	d.holdPost(id, u.plain.URL+"/dropped-during-commit")
	if rb, err := c.Rollback(ctx, id, api.RollbackRequest{To: ck.ID}); err != nil || rb.EffectsDropped != 1 {
		t.Fatalf("rollback during a hung commit: %+v, %v; want one effect dropped", rb, err)
	}
	d.cli("verify", id)
	d.kill()
	start := time.Now()
	d.start() // waits for the API to answer
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("API answered %s after a restart with a hung commit to resume", took)
	}
}

// nodeContainers counts the containers of the daemon's node.
func (d *daemon) nodeContainers() int {
	d.t.Helper()
	data, err := os.ReadFile(filepath.Join(d.root, "node-id"))
	if err != nil {
		d.t.Fatal(err)
	}
	c, err := containerd.New(d.env.containerd, containerd.WithDefaultNamespace("deltabox"))
	if err != nil {
		d.t.Fatal(err)
	}
	defer c.Close()
	cs, err := c.Containers(context.Background(), fmt.Sprintf(`labels.%q==%s`, pool.LabelNode, strings.TrimSpace(string(data))))
	if err != nil {
		d.t.Fatal(err)
	}
	return len(cs)
}

// TestFaultsDestroyRetried: a destroy that fails (containerd unavailable) is retried in the
// background, and at the next start; the released sandbox never comes back as leased.
func TestFaultsDestroyRetried(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1, "--max", "3")
	for _, c := range []struct {
		name, spec string
		restart    bool
	}{{"retried", "pool/destroy=1*error", false}, {"at-start", "pool/destroy=error", true}} {
		t.Run(c.name, func(t *testing.T) {
			d.t = t
			d.restartWith(c.spec)
			id := d.lease("bb").ID
			d.waitReady("bb", 1, 60*time.Second)
			n := d.nodeContainers()
			d.cli("release", id)
			if c.restart {
				time.Sleep(200 * time.Millisecond) // the failed destroy records its tombstone
				d.restartWith("")
			}
			testutil.WaitFor(t, 30*time.Second, 50*time.Millisecond, "the released sandbox's container to go", func() bool {
				return d.nodeContainers() == n-1
			})
			sbs, err := d.client().Sandboxes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range sbs {
				if sb.ID == id {
					t.Fatalf("released sandbox %s is leased again after its destroy failed", id)
				}
			}
		})
	}
	d.t = t
}

// TestFaultsRollbackFails: a rollback step that fails (as on a full disk) after the files
// were rewritten leaves the rollback pending, never torn for good: the sandbox runs, state
// patches are refused, the next checkpoint finishes the rollback first, and the rolled-back
// effect is never sent.
func TestFaultsRollbackFails(t *testing.T) {
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 1, "")
	id := d.lease("net", noProxyBypass...).ID
	var target api.Checkpoint
	d.cliJSON(&target, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo dirty > /root/step")
	d.cli("state", "patch", id, `[{"op":"add","path":"/step","value":"dirty"}]`)
	d.holdPost(id, u.plain.URL+"/pending")
	d.restartWith("rollback/after-files=1*error")
	_, errOut, code := d.cliRaw("rollback", id, "--to", target.ID)
	if code == 0 || !strings.Contains(errOut, "pending") {
		t.Fatalf("failed rollback: exit %d, %q; want an error saying it is pending", code, errOut)
	}
	if _, errOut, code := d.cliRaw("state", "patch", id, `[{"op":"add","path":"/more","value":1}]`); code == 0 || !strings.Contains(errOut, "pending rollback") {
		t.Fatalf("state patch during a pending rollback: exit %d, %q", code, errOut)
	}
	d.cli("exec", id, "--timeout", "10s", "--", "true") // not frozen
	d.cli("checkpoint", "create", id)                   // finishes the rollback first
	if _, _, code := d.cliRaw("exec", id, "--", "test", "-e", "/root/step"); code == 0 || strings.Contains(d.stateDoc(id), "dirty") {
		t.Fatalf("pending rollback not finished by the next checkpoint: state %s", d.stateDoc(id))
	}
	d.cli("commit", id)
	if n := u.count("POST /pending"); n != 0 || d.effectStatus(id, u.plain.URL+"/pending") != "dropped" {
		t.Fatalf("effect of the pending rollback: sent %d times, %s", n, d.effectStatus(id, u.plain.URL+"/pending"))
	}
}
