package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/proto"

	"github.com/deltabox/deltabox/criu"
	"github.com/deltabox/deltabox/internal/failpoint"
	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/snapsign"
	"github.com/deltabox/deltabox/pool"
)

// Attacks by whoever can write the snapshot store (issue 11): only manifests signed by a
// trusted key are restored, and nothing is fetched from a manifest before its signature holds.

// signer loads the daemon's snapshot signing key (the test plays a node of the fleet).
func (d *daemon) signer() *snapsign.Signer {
	d.t.Helper()
	s, err := snapsign.LoadOrCreate(filepath.Join(d.root, "keys", "snapshot.key"))
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

// trustConfig is the [snapshots] section of a node that trusts the keys of nodes.
func trustConfig(nodes ...*daemon) string {
	var files []string
	for _, n := range nodes {
		files = append(files, `"`+filepath.Join(n.root, "keys", "snapshot.key.pub")+`"`)
	}
	return "[snapshots]\ntrusted_keys = [" + strings.Join(files, ", ") + "]\n"
}

// snapshotDir is where a file:// store keeps a snapshot's manifest and signature.
func snapshotDir(store, name string) string {
	return filepath.Join(strings.TrimPrefix(store, "file://"), "objects", "snapshots", name)
}

// writeManifest stores manifest bytes as snapshot name, signed by signer (nil: unsigned).
func writeManifest(t *testing.T, store, name string, manifest []byte, signer *snapsign.Signer) {
	t.Helper()
	dir := snapshotDir(store, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	sigPath := filepath.Join(dir, "manifest.sig")
	if signer == nil {
		if err := os.Remove(sigPath); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return
	}
	sig, err := signer.Sign(name, manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sigPath, sig, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copySnapshot stores snapshot name again as newName with its manifest changed by edit
// (which may be nil) and signed by signer, or, with keepSig, under the original signature.
func copySnapshot(t *testing.T, store, name, newName string, edit func(m map[string]any), signer *snapsign.Signer, keepSig bool) string {
	t.Helper()
	m, _ := readSnapshot(t, store, name)
	if edit != nil {
		edit(m)
	}
	data, _ := json.Marshal(m)
	writeManifest(t, store, newName, data, signer)
	if keepSig {
		sig, err := os.ReadFile(filepath.Join(snapshotDir(store, name), "manifest.sig"))
		if err != nil {
			t.Fatal(err)
		}
		// A signature binds the name too: re-sign the original bytes under the new name is
		// not possible without the key, so the attacker copies the signature as it is.
		if err := os.WriteFile(filepath.Join(snapshotDir(store, newName), "manifest.sig"), sig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return store + "#" + newName
}

func TestEscapeSnapshotSignatures(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	store := "file://" + shortTempDir(t)
	id := startCounter(d)
	snap, err := c.SnapshotPush(ctx, id, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodeKey := snapsign.Fingerprint(d.signer().Public())
	before, _ := c.Sandboxes(ctx)

	// A manifest changed after signing (its config pointed at a blob that does not exist, so a
	// fetch before the check would say not_found) is refused as a bad signature.
	forged := copySnapshot(t, store, snap.Name, snap.Name+"-forged", func(m map[string]any) {
		m["config"].(map[string]any)["digest"] = "sha256:" + strings.Repeat("0", 64)
	}, nil, true)
	_, err = c.Restore(ctx, forged, "", nil)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), nodeKey) || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("forged manifest: want permission_denied naming key %s, got %v", nodeKey, err)
	}

	// The same manifest re-signed by a key nobody trusts.
	_, priv, _ := ed25519.GenerateKey(nil)
	rogue := snapsign.NewSigner(priv)
	resigned := copySnapshot(t, store, snap.Name, snap.Name+"-rogue", nil, rogue, false)
	_, err = c.Restore(ctx, resigned, "", nil)
	rogueKey := snapsign.Fingerprint(rogue.Public())
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), rogueKey) || !strings.Contains(err.Error(), "does not trust") {
		t.Errorf("untrusted key: want permission_denied naming key %s, got %v", rogueKey, err)
	}

	// No signature at all.
	unsigned := copySnapshot(t, store, snap.Name, snap.Name+"-unsigned", nil, nil, false)
	_, err = c.Restore(ctx, unsigned, "", nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("unsigned manifest: want failed_precondition saying so, got %v", err)
	}
	// A signature copied from another snapshot does not cover this name.
	renamed := copySnapshot(t, store, snap.Name, snap.Name+"-renamed", nil, nil, true)
	if _, err = c.Restore(ctx, renamed, "", nil); !errdefs.IsPermissionDenied(err) {
		t.Errorf("signature of another name: want permission_denied, got %v", err)
	}
	if after, _ := c.Sandboxes(ctx); len(after) != len(before) {
		t.Errorf("refused restores left sandboxes behind: %d before, %d after", len(before), len(after))
	}

	// A second node that trusts this one's key restores its snapshot; one that does not, refuses.
	trusting := startDaemonWith(t, trustConfig(d))
	trusting.createPool("py", pythonImage, 0)
	if _, err := trusting.client().Restore(ctx, snap.URI, "", nil); err != nil {
		t.Fatalf("node trusting %s: restore: %v", nodeKey, err)
	}
	var info api.Info
	trusting.cliJSON(&info, "info")
	if !slices.Contains(info.Snapshots.Trusted, nodeKey) || len(info.Snapshots.Trusted) != 2 || info.Snapshots.SigningKey == nodeKey {
		t.Errorf("info of the trusting node: %+v, want its own key and %s trusted", info.Snapshots, nodeKey)
	}
	stranger := startDaemon(t)
	stranger.createPool("py", pythonImage, 0)
	if _, err := stranger.client().Restore(ctx, snap.URI, "", nil); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), nodeKey) {
		t.Errorf("node without trust: want permission_denied naming %s, got %v", nodeKey, err)
	}
}

// editBlob stores a new version of the snapshot's layer titled title (made by edit from the
// old blob's bytes) as snapshot newName, signed by signer.
func editBlob(t *testing.T, store, name, newName, title string, signer *snapsign.Signer, edit func(old []byte) []byte) string {
	t.Helper()
	return copySnapshot(t, store, name, newName, func(m map[string]any) {
		_, blobPath := readSnapshot(t, store, name)
		for _, l := range m["layers"].([]any) {
			desc := l.(map[string]any)
			if desc["annotations"].(map[string]any)["org.opencontainers.image.title"] != title {
				continue
			}
			old, err := os.ReadFile(blobPath(desc["digest"].(string)))
			if err != nil {
				t.Fatal(err)
			}
			data := edit(old)
			sum := sha256.Sum256(data)
			d := "sha256:" + hex.EncodeToString(sum[:])
			if err := os.WriteFile(blobPath(d), data, 0o644); err != nil {
				t.Fatal(err)
			}
			desc["digest"], desc["size"] = d, len(data)
			return
		}
		t.Fatalf("no %s blob in %s", title, name)
	}, signer, false)
}

// raiseCaps unpacks a CRIU images blob, gives the python3 process every capability in its
// effective set and packs it again.
func raiseCaps(t *testing.T, blob []byte) ([]byte, criu.Meta) {
	t.Helper()
	ctx, dir := context.Background(), t.TempDir()
	if err := criu.Unpack(ctx, bytes.NewReader(blob), dir); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "core-*.img"))
	raised := false
	for _, n := range names {
		core, write := decodeCore(t, n)
		if core.GetTc().GetComm() != "python3" {
			continue
		}
		core.ThreadCore.Creds.CapEff = []uint32{^uint32(0), 0x1ff}
		write(core)
		raised = true
	}
	if !raised {
		t.Fatalf("no python3 process among %v", names)
	}
	var buf bytes.Buffer
	meta, err := criu.Pack(ctx, dir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), meta
}

// decodeCore reads the CoreEntry of a CRIU core image (8 bytes of magic, a little-endian
// size, the entry) and returns a function that writes an edited entry back.
func decodeCore(t *testing.T, path string) (*criucore.CoreEntry, func(*criucore.CoreEntry)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	size := binary.LittleEndian.Uint32(data[8:])
	var core criucore.CoreEntry
	if err := proto.Unmarshal(data[12:12+size], &core); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return &core, func(c *criucore.CoreEntry) {
		payload, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		out := binary.LittleEndian.AppendUint32(append([]byte(nil), data[:8]...), uint32(len(payload)))
		if err := os.WriteFile(path, append(out, payload...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEscapeSnapshotForgedCapabilities(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	store := "file://" + shortTempDir(t)
	id := startCounter(d)
	snap, err := c.SnapshotPush(ctx, id, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := c.Sandboxes(ctx)
	// Signed with the node's own key: only the credentials check stands in the way.
	var meta criu.Meta
	forged := editBlob(t, store, snap.Name, snap.Name+"-caps", "criu-images.tar.zst", d.signer(), func(b []byte) []byte {
		var out []byte
		out, meta = raiseCaps(t, b)
		return out
	})
	// The forger records the new archive's size in the config too.
	_, forgedName, _ := strings.Cut(forged, "#")
	forged = rewriteConfig(t, store, forgedName, "unpackedBytes", meta.UnpackedBytes, d.signer())
	_, err = c.Restore(ctx, forged, "", nil)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), `"python3"`) || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") {
		t.Fatalf("core image with full effective capabilities: want permission_denied naming python3 and CAP_SYS_ADMIN, got %v", err)
	}
	if after, _ := c.Sandboxes(ctx); len(after) != len(before) {
		t.Errorf("refused restore left sandboxes behind: %d before, %d after", len(before), len(after))
	}
	if _, err := c.Restore(ctx, snap.URI, "", nil); err != nil {
		t.Errorf("the untouched snapshot no longer restores: %v", err)
	}
}

// Egress policies for the policy tests: the pool's, one reaching the host's loopback, and the
// pool's narrowed by a deny rule in front.
const (
	poolPolicy   = "version: 1\ndefault: deny\nrules:\n  - host: api.example.com\n    action: pass\n"
	localPolicy  = "version: 1\ndefault: deny\nrules:\n  - host: 127.0.0.1\n    action: pass\n  - host: api.example.com\n    action: pass\n"
	narrowPolicy = "version: 1\ndefault: deny\nrules:\n  - host: api.example.com\n    path_prefix: /admin\n    action: deny\n  - host: api.example.com\n    action: pass\n"
)

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEscapeSnapshotPolicyNeverWidens(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	d.createPool("bb", busyboxImage, 0, "--egress-policy", writeTemp(t, "pool.yaml", poolPolicy))
	wide := d.lease("bb", "--egress-policy", writeTemp(t, "local.yaml", localPolicy)).ID
	snap, err := c.SnapshotPush(ctx, wide, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot's policy reaches 127.0.0.1; the pool's does not: refused, whatever pool.
	_, err = c.Restore(ctx, snap.URI, "", nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "egress policy") {
		t.Errorf("restore of a snapshot whose policy reaches 127.0.0.1 into a pool whose policy does not: want failed_precondition naming the egress policy, got %v", err)
	}
	// A missing pool is not created from the snapshot's template.
	_, err = c.Restore(ctx, snap.URI, "made-from-snapshot", nil)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "does not create pools") {
		t.Errorf("restore into a missing pool: want not_found saying no pool is created, got %v", err)
	}
	pools, _ := c.Pools(ctx)
	for _, p := range pools {
		if p.Name == "made-from-snapshot" || p.EgressPolicy != poolPolicy {
			t.Errorf("after refused restores: pool %q with policy %q", p.Name, p.EgressPolicy)
		}
	}
	// A policy that only narrows the pool's is kept.
	narrow := d.lease("bb", "--egress-policy", writeTemp(t, "narrow.yaml", narrowPolicy)).ID
	snap2, err := c.SnapshotPush(ctx, narrow, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Restore(ctx, snap2.URI, "", nil)
	if err != nil {
		t.Fatalf("restore of a narrowing policy: %v", err)
	}
	if sb, err := c.Sandbox(ctx, l.ID); err != nil || sb.EgressPolicy != narrowPolicy {
		t.Errorf("restored sandbox's policy: %q (%v), want the snapshot's narrower one", sb.EgressPolicy, err)
	}
}

// zeroReader is an endless reader of zero bytes.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// zstdTar is a zstd-compressed tar of the given files (name → content) and, last, one file
// named bombName of bombSize zero bytes: a few hundred KB that decompress to gigabytes.
func zstdTar(t *testing.T, files map[string][]byte, bombName string, bombSize int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest))
	tw := tar.NewWriter(zw)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	if err := tw.WriteHeader(&tar.Header{Name: bombName, Typeflag: tar.TypeReg, Mode: 0o644, Size: bombSize}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(tw, zeroReader{}, bombSize); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// metaOf returns the deltabox-meta.json inside a CRIU images blob.
func metaOf(t *testing.T, blob []byte) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := criu.Unpack(context.Background(), bytes.NewReader(blob), dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, criu.MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestEscapeSnapshotZipBombs(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	store := "file://" + shortTempDir(t)
	id := startCounter(d)
	snap, err := c.SnapshotPush(ctx, id, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := c.Sandboxes(ctx)
	signer := d.signer()
	criuBomb := editBlob(t, store, snap.Name, snap.Name+"-criubomb", "criu-images.tar.zst", signer, func(old []byte) []byte {
		b := zstdTar(t, map[string][]byte{criu.MetaFile: metaOf(t, old)}, "pages-1.img", 1<<30)
		t.Logf("CRIU images blob of %d bytes unpacking to 1 GiB", len(b))
		return b
	})
	_, err = c.Restore(ctx, criuBomb, "", nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "recorded") {
		t.Errorf("CRIU images zip bomb: want invalid_argument naming the recorded size, got %v", err)
	}
	rootfsBomb := editBlob(t, store, snap.Name, snap.Name+"-rootfsbomb", "rootfs.tar.zst", signer, func([]byte) []byte {
		return zstdTar(t, nil, "root/big", 1<<30)
	})
	_, err = c.Restore(ctx, rootfsBomb, "", nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "recorded size") {
		t.Errorf("rootfs diff zip bomb: want invalid_argument naming the recorded size, got %v", err)
	}
	if after, _ := c.Sandboxes(ctx); len(after) != len(before) {
		t.Errorf("refused restores left sandboxes behind: %d before, %d after", len(before), len(after))
	}
	if left, _ := os.ReadDir(filepath.Join(d.root, "restore")); len(left) != 0 {
		t.Errorf("refused restores left %d staging directories", len(left))
	}
}

// nodeContainers counts the containerd containers of a daemon's node.
func nodeContainers(t *testing.T, d *daemon) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.root, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := containerd.New(d.env.containerd, containerd.WithDefaultNamespace("deltabox"))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cs, err := client.Containers(context.Background(), fmt.Sprintf(`labels.%q==%s`, pool.LabelNode, strings.TrimSpace(string(data))))
	if err != nil {
		t.Fatal(err)
	}
	return len(cs)
}

func TestSnapshotRestoreTimeout(t *testing.T) {
	// The restored task exists but does not start within the timeout: the restore is stopped,
	// its task and container removed.
	t.Setenv(failpoint.EnvVar, "criu/restore-created=sleep(3000)")
	d := startDaemonWith(t, "[snapshots]\nrestore_timeout = \"1s\"\n")
	c, ctx := d.client(), context.Background()
	id := startCounter(d)
	snap, err := c.SnapshotPush(ctx, id, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	d.waitReady("py", 1, 30*time.Second)
	containers := nodeContainers(t, d)
	start := time.Now()
	_, err = c.Restore(ctx, snap.URI, "", nil)
	if !errdefs.IsDeadlineExceeded(err) || !strings.Contains(err.Error(), "did not finish in time") {
		t.Fatalf("restore past its timeout: want deadline_exceeded, got %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the timed-out restore took %s", took)
	}
	testutil.WaitFor(t, 10*time.Second, 50*time.Millisecond, "the timed-out restore's container to go", func() bool {
		return nodeContainers(t, d) == containers
	})
	if sbs, _ := c.Sandboxes(ctx); len(sbs) != 1 {
		t.Errorf("after a timed-out restore %d sandboxes are leased, want the source only", len(sbs))
	}
}

// TestEscapeSnapshotSymlinkedEtc: a sandbox turns the files a restore could write
// (/etc/machine-id, /etc/hostname, /etc/hosts, /etc/resolv.conf) into symlinks to host files;
// restore and fork write only into the restored sandbox, never through them.
func TestEscapeSnapshotSymlinkedEtc(t *testing.T) {
	d := startDaemon(t)
	c, ctx := d.client(), context.Background()
	dir := shortTempDir(t)
	names := []string{"machine-id", "hostname", "hosts", "resolv.conf"}
	canary := map[string]string{}
	var script []string
	for _, n := range names {
		p := filepath.Join(dir, "canary-"+n)
		canary[p] = "host canary " + n + "\n"
		if err := os.WriteFile(p, []byte(canary[p]), 0o644); err != nil {
			t.Fatal(err)
		}
		script = append(script, fmt.Sprintf("rm -f /etc/%s; ln -s %s /etc/%s", n, p, n))
	}
	d.createPool("bb", busyboxImage, 0)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /etc; "+strings.Join(script, "; "))
	snap, err := c.SnapshotPush(ctx, id, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Restore(ctx, snap.URI, "", nil)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	forks := strings.Fields(d.cli("fork", id, "--count", "1"))
	for p, want := range canary {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("host file %s: %q (%v) after restore and fork, want it untouched", p, got, err)
		}
	}
	// The restored sandbox has its own machine id, a plain file in place of the symlink.
	for _, sb := range append(forks, l.ID) {
		out := d.cli("exec", sb, "--", "sh", "-c", "test -f /etc/machine-id && test ! -L /etc/machine-id && cat /etc/machine-id")
		if len(strings.TrimSpace(out)) != 32 {
			t.Errorf("sandbox %s: /etc/machine-id is %q, want a fresh 32-hex-digit id", sb, out)
		}
	}
}
