package integration

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestDamagedCheckpointIsNamed: four flipped bytes in an older checkpoint's file data were
// restored by rollback without a word, and verify passed afterwards. Now the rollback to it
// is refused naming the checkpoint and the path (nothing is written), verify names the
// damaged checkpoint, and the sandbox's other checkpoints stay usable.
func TestDamagedCheckpointIsNamed(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "echo one-one-one-one > /root/f")
	var a, b api.Checkpoint
	d.cliJSON(&a, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo two-two-two-two > /root/f")
	d.cliJSON(&b, "checkpoint", "create", id)
	d.cli("exec", id, "--", "sh", "-c", "echo three > /root/f")

	pack := filepath.Join(d.root, "sandboxes", id, "layers", a.ID+".ckpt")
	flipContent(t, pack, "root/f", 4)

	_, errOut, code := d.cliRaw("rollback", id, "--to", a.ID)
	if code == 0 || !strings.Contains(errOut, "checkpoint "+a.ID+" is damaged") || !strings.Contains(errOut, `"root/f"`) {
		t.Fatalf("rollback to the damaged checkpoint: exit %d, %s", code, errOut)
	}
	if out := d.cli("exec", id, "--", "cat", "/root/f"); out != "three\n" {
		t.Fatalf("the refused rollback wrote /root/f: %q", out)
	}
	var v api.VerifyResult
	_, _, _ = d.cliRaw("verify", id) // text form exits non-zero on problems
	d.cliJSONAllowFail(&v, "verify", id)
	if v.OK || !strings.Contains(strings.Join(v.Problems, "\n"), "checkpoint "+a.ID+" is damaged") {
		t.Fatalf("verify after damage: %+v", v)
	}
	d.cli("rollback", id, "--to", b.ID)
	if out := d.cli("exec", id, "--", "cat", "/root/f"); out != "two-two-two-two\n" {
		t.Fatalf("after rollback to the intact %s: %q", b.ID, out)
	}
}

// cliJSONAllowFail decodes the JSON the CLI prints even when it exits non-zero.
func (d *daemon) cliJSONAllowFail(v any, args ...string) {
	d.t.Helper()
	out, errOut, _ := d.cliRaw(append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		d.t.Fatalf("%v: %v\nstdout %s\nstderr %s", args, err, out, errOut)
	}
}

// flipContent flips n bytes of path p's content in a checkpoint pack (the manifest is found
// through the pack's footer: magic, manifest offset, length, checksum).
func flipContent(t *testing.T, pack, p string, n int) {
	t.Helper()
	data, err := os.ReadFile(pack)
	if err != nil {
		t.Fatal(err)
	}
	foot := data[len(data)-24:]
	off := binary.LittleEndian.Uint64(foot[8:])
	size := binary.LittleEndian.Uint32(foot[16:])
	var m struct {
		Entries []struct {
			P   string `json:"p"`
			Off int64  `json:"off"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(data[off:off+uint64(size)], &m); err != nil {
		t.Fatal(err)
	}
	for _, e := range m.Entries {
		if e.P == p {
			for i := range n {
				data[e.Off+int64(i)] ^= 0x20
			}
			if err := os.WriteFile(pack, data, 0o600); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("%s not in %s", p, pack)
}
