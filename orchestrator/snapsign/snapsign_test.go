package snapsign

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestLoadOrCreateKeepsTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "snapshot.key")
	a, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", info.Mode(), err)
	}
	b, err := LoadOrCreate(path)
	if err != nil || !a.Public().Equal(b.Public()) {
		t.Fatalf("second load gave another key (%v)", err)
	}
	keys, err := ParseTrusted([]string{path + ".pub"})
	if err != nil || len(keys) != 1 || !keys[0].Equal(a.Public()) {
		t.Fatalf("the .pub file does not hold the key: %v %v", keys, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(path); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a world-readable key: want failed_precondition, got %v", err)
	}
}

func TestVerify(t *testing.T) {
	dir := t.TempDir()
	node, _ := LoadOrCreate(filepath.Join(dir, "a.key"))
	other, _ := LoadOrCreate(filepath.Join(dir, "b.key"))
	v := NewVerifier(node.Public())
	manifest := []byte(`{"schemaVersion":2}`)
	sig, err := node.Sign("snap-1", manifest)
	if err != nil {
		t.Fatal(err)
	}
	if fp, err := v.Verify("snap-1", manifest, sig); err != nil || fp != Fingerprint(node.Public()) {
		t.Fatalf("valid signature: %q %v", fp, err)
	}
	forged := []byte(`{"schemaVersion":2,"x":1}`)
	if _, err := v.Verify("snap-1", forged, sig); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), Fingerprint(node.Public())) {
		t.Errorf("changed manifest: want permission denied naming the key, got %v", err)
	}
	if _, err := v.Verify("snap-2", manifest, sig); !errdefs.IsPermissionDenied(err) {
		t.Errorf("signature under another name: want permission denied, got %v", err)
	}
	otherSig, _ := other.Sign("snap-1", manifest)
	if _, err := v.Verify("snap-1", manifest, otherSig); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), Fingerprint(other.Public())) {
		t.Errorf("untrusted key: want permission denied naming it, got %v", err)
	}
	if _, err := v.Verify("snap-1", manifest, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("unsigned: want failed_precondition, got %v", err)
	}
}

func TestParseTrusted(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(nil)
	pub2, _, _ := ed25519.GenerateKey(nil)
	file := filepath.Join(t.TempDir(), "fleet.keys")
	body := "# fleet\n" + string(MarshalPublic(pub2)) + "\n" + Inline(pub) + "\n"
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	keys, err := ParseTrusted([]string{Inline(pub), file})
	if err != nil || len(keys) != 3 {
		t.Fatalf("got %d keys, %v", len(keys), err)
	}
	for _, bad := range []string{"ed25519:AAAA", filepath.Join(t.TempDir(), "missing")} {
		if _, err := ParseTrusted([]string{bad}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), bad) {
			t.Errorf("entry %q: want invalid_argument naming it, got %v", bad, err)
		}
	}
}
