package orchestrator

import (
	"os"
	"path/filepath"
	"testing"
)

// closedAncestor names the first directory above the state root that others cannot search
// (the daemon warns at start: user-namespaced CRIU restores would fail below it).
func TestClosedAncestor(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} { // the test's own temp dirs (0700)
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	closed := filepath.Join(base, "closed")
	root := filepath.Join(closed, "open", "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := closedAncestor(root); got != closed {
		t.Fatalf("closedAncestor(%s) = %q, want %q", root, got, closed)
	}
	if err := os.Chmod(closed, 0o711); err != nil {
		t.Fatal(err)
	}
	if got := closedAncestor(root); got != "" {
		t.Fatalf("closedAncestor(%s) = %q with every directory below the temp dir searchable", root, got)
	}
}
