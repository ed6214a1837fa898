package orchestrator

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSweep is issue 12.9: what interrupted releases and restores left is removed at start;
// what belongs to leased sandboxes stays.
func TestSweep(t *testing.T) {
	root := t.TempDir()
	fx := newFakeEffects()
	o := &Orchestrator{opts: Options{Root: root}, effects: fx, sessions: map[string]*session{}}
	for _, p := range []string{"sandboxes/sb-live/layers", "sandboxes/sb-gone/layers", "restore/snap-1/blobs", "criu-work/dump-1"} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	jdir := filepath.Join(root, "proxy", "journal")
	os.MkdirAll(jdir, 0o700)
	for _, j := range []string{"sb-live.journal", "sb-gone.journal"} {
		os.WriteFile(filepath.Join(jdir, j), nil, 0o600)
	}
	o.sweep(context.Background(), map[string]bool{"sb-live": true})
	for _, p := range []string{"sandboxes/sb-gone", "restore/snap-1", "criu-work/dump-1"} {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left behind", p)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "sandboxes/sb-live/layers")); err != nil {
		t.Errorf("a leased sandbox's state was swept: %v", err)
	}
	waitFor(t, func() bool { fx.mu.Lock(); defer fx.mu.Unlock(); return len(fx.forgot) > 0 })
	fx.mu.Lock()
	defer fx.mu.Unlock()
	if !slices.Equal(fx.forgot, []string{"sb-gone"}) {
		t.Fatalf("journals removed: %v, want only sb-gone's", fx.forgot)
	}
}
