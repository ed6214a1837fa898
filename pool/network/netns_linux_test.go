package network

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// mountOf returns the mountinfo line of the mount point dir, or "".
func mountOf(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	line := ""
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			line = l // the last one is the top of the stack
		}
	}
	return line
}

// TestShareNetNSDir: a fresh namespace dir becomes a shared mount point of its own (so a later
// `ip netns add` does not bind-mount it over DeltaBox's namespaces), once; a dir that already
// holds entries is left alone.
func TestShareNetNSDir(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		for mountOf(t, dir) != "" {
			if unix.Unmount(dir, unix.MNT_DETACH) != nil {
				return
			}
		}
	})
	if err := shareNetNSDir(dir); err != nil {
		t.Fatal(err)
	}
	line := mountOf(t, dir)
	if line == "" || !strings.Contains(line, "shared:") {
		t.Fatalf("netns dir is not a shared mount point: %q", line)
	}
	if err := shareNetNSDir(dir); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(mustRead(t, "/proc/self/mountinfo"), " "+dir+" "); n != 1 {
		t.Fatalf("netns dir mounted %d times after a second call, want 1", n)
	}

	busy := t.TempDir()
	if err := os.WriteFile(filepath.Join(busy, "old-ns"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := shareNetNSDir(busy); err != nil {
		t.Fatal(err)
	}
	if line := mountOf(t, busy); line != "" {
		t.Fatalf("a netns dir holding entries was mounted over: %q", line)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
