//go:build linux

package criu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestPrimeKdatCache: after PrimeKdatCache a CRIU run loads its kernel-features cache instead
// of probing the kernel again, on a node whose /run is not a tmpfs (where CRIU never writes
// the cache itself) as on one where it is.
func TestPrimeKdatCache(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "criu")
	if err := os.Remove(KdatCache); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	primed, err := PrimeKdatCache(context.Background(), "criu")
	if err != nil {
		t.Fatal(err)
	}
	if !primed { // /run is a tmpfs: the first CRIU run writes the cache
		if out, err := exec.Command("criu", "check").CombinedOutput(); err != nil {
			t.Fatalf("criu check: %v: %s", err, out)
		}
	}
	info, err := os.Stat(KdatCache)
	if err != nil {
		t.Fatalf("no cache after PrimeKdatCache (primed %v): %v", primed, err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		t.Fatalf("%s is %v: others can read or write it", KdatCache, info.Mode())
	}
	work := t.TempDir()
	out, err := exec.Command("criu", "check", "-v4", "-W", work, "-o", "check.log").CombinedOutput()
	if err != nil {
		t.Fatalf("criu check: %v: %s", err, out)
	}
	log, err := os.ReadFile(filepath.Join(work, "check.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "Loaded kdat cache from "+KdatCache) {
		t.Fatalf("criu did not load %s (primed %v); its log begins:\n%.600s", KdatCache, primed, log)
	}
}
