package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestPoolDatabaseDamage: the pool database is not trusted blindly. Each case leases a
// sandbox, checkpoints it, stops the daemon, damages pool.db, and starts the daemon again:
// the daemon starts, the leased sandbox is not destroyed (quarantined, with its session
// directory and checkpoints intact, or still leased when its record survived), commands on a
// quarantined sandbox are refused naming the way out, and `sandbox adopt` brings it back with
// its checkpoints usable.
func TestPoolDatabaseDamage(t *testing.T) {
	cases := []struct {
		name         string
		damage       func(t *testing.T, db string, l api.Lease)
		quarantined  bool // must be quarantined (else it may also have survived as leased)
		recreatePool bool // the pool's template is gone with the database
	}{
		{"flipped byte in the leased record", flipRecordByte, true, false},
		{"missing pool.db", func(t *testing.T, db string, _ api.Lease) {
			if err := os.Remove(db); err != nil {
				t.Fatal(err)
			}
		}, true, true},
		{"pool.db cut in half", func(t *testing.T, db string, _ api.Lease) {
			st, err := os.Stat(db)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(db, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, false, false},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
			d := startDaemon(t)
			d.createPool("bb", busyboxImage, 1)
			l := d.lease("bb")
			d.cli("exec", l.ID, "--", "sh", "-c", "echo one > /root/f")
			var ck api.Checkpoint
			d.cliJSON(&ck, "checkpoint", "create", l.ID)
			d.cli("exec", l.ID, "--", "sh", "-c", "echo two > /root/f")
			d.stop()
			tc.damage(t, filepath.Join(d.root, "pool", "pool.db"), l)
			d.start()

			sb, found := findSandbox(d, l.ID)
			if !found {
				t.Fatalf("sandbox %s is gone after the start\n%s", l.ID, d.logTail())
			}
			packs, _ := filepath.Glob(filepath.Join(d.root, "sandboxes", l.ID, "layers", "*.ckpt"))
			if len(packs) < 2 {
				t.Fatalf("checkpoints of %s after the start: %v", l.ID, packs)
			}
			if tc.quarantined && sb.State != api.StateQuarantined {
				t.Fatalf("sandbox state %q (%s), want quarantined", sb.State, sb.Reason)
			}
			if sb.State == api.StateQuarantined {
				_, errOut, code := d.cliRaw("exec", l.ID, "--", "true")
				if code == 0 || !strings.Contains(errOut, "quarantined") || !strings.Contains(errOut, "sandbox adopt") {
					t.Fatalf("exec on a quarantined sandbox: exit %d, %s", code, errOut)
				}
				if tc.recreatePool {
					if _, errOut, code := d.cliRaw("sandbox", "adopt", l.ID); code == 0 || !strings.Contains(errOut, "does not exist") {
						t.Fatalf("adopt into a pool that is gone: exit %d, %s", code, errOut)
					}
					d.cli("pool", "create", "bb", "--image", busyboxImage, "--min-ready", "0")
				}
				var adopted api.Sandbox
				d.cliJSON(&adopted, "sandbox", "adopt", l.ID, "--pool", "bb")
				if adopted.ID != l.ID || adopted.State != api.StateLeased {
					t.Fatalf("adopted %+v", adopted)
				}
			}
			d.cli("rollback", l.ID, "--to", ck.ID)
			if out := d.cli("exec", l.ID, "--", "cat", "/root/f"); out != "one\n" {
				t.Fatalf("after rollback to %s: /root/f = %q", ck.ID, out)
			}
			d.cli("release", l.ID)
		})
	}
}

// TestQuarantinedSandboxDestroy: `sandbox destroy` removes a quarantined sandbox, its
// container and its session directory.
func TestQuarantinedSandboxDestroy(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	l := d.lease("bb")
	d.stop()
	flipRecordByte(t, filepath.Join(d.root, "pool", "pool.db"), l)
	d.start()
	if sb, _ := findSandbox(d, l.ID); sb.State != api.StateQuarantined {
		t.Fatalf("state %q, want quarantined", sb.State)
	}
	d.cli("sandbox", "destroy", l.ID)
	if _, found := findSandbox(d, l.ID); found {
		t.Fatal("destroyed sandbox still listed")
	}
	if _, err := os.Stat(filepath.Join(d.root, "sandboxes", l.ID)); !os.IsNotExist(err) {
		t.Fatalf("session dir after destroy: %v", err)
	}
	if _, _, code := d.cliRaw("sandbox", "adopt", l.ID); code == 0 {
		t.Fatal("adopt after destroy succeeded")
	}
}

func findSandbox(d *daemon, id string) (api.Sandbox, bool) {
	var sbs []api.Sandbox
	d.cliJSON(&sbs, "ls")
	for _, s := range sbs {
		if s.ID == id {
			return s, true
		}
	}
	return api.Sandbox{}, false
}

// flipRecordByte changes one byte inside the JSON of the lease's container record.
func flipRecordByte(t *testing.T, path string, l api.Lease) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("containers"))
		v := append([]byte(nil), b.Get([]byte(l.Container))...)
		if len(v) < 20 {
			t.Fatalf("no record of container %s", l.Container)
		}
		v[len(v)-5] ^= 0x01
		return b.Put([]byte(l.Container), v)
	})
	if err != nil {
		t.Fatal(err)
	}
}
