package pool

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestForkLowerPath(t *testing.T) {
	const upper = "/var/lib/c/root/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs"
	dir, err := forkLowerPath(upper, "flm-1")
	if err != nil || dir != "/var/lib/c/root/io.containerd.snapshotter.v1.overlayfs/deltabox-forklowers/flm-1" {
		t.Fatalf("forkLowerPath: %q %v", dir, err)
	}
	dir, err = forkLowerPath(upper, "fld-1")
	if err != nil || dir != "/var/lib/c/root/io.containerd.snapshotter.v1.overlayfs/deltabox-forklowers-disk/fld-1" {
		t.Fatalf("forkLowerPath: %q %v", dir, err)
	}
	if _, err := forkLowerPath("/somewhere/upper", "flm-1"); err == nil {
		t.Fatal("an upper dir that is not an overlay snapshot's was accepted")
	}
	if _, err := forkLowerPath(upper, "../x"); err == nil {
		t.Fatal("a label that is not a layer id was accepted")
	}
}

func TestForkLowersList(t *testing.T) {
	m := &Manager{opts: Options{Root: t.TempDir()}, flPins: map[string]int{}}
	a, b := "/r/deltabox-forklowers/flm-a", "/r/deltabox-forklowers-disk/fld-b"
	if err := m.writeForkLowers([]string{a, b}); err != nil {
		t.Fatal(err)
	}
	got, err := m.readForkLowers()
	if err != nil || !slices.Equal(got, []string{a, b}) {
		t.Fatalf("list: %v %v", got, err)
	}
	// Lines NewForkLower never writes are ignored (a damaged or edited list removes nothing else).
	junk := "/etc\nrelative/flm-x\n/r/other/flm-c\n/r/deltabox-forklowers/../flm-d\n/r/deltabox-forklowers/fld-e\n" + a + "\n"
	if err := os.WriteFile(filepath.Join(m.opts.Root, forkLowersList), []byte(junk), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.readForkLowers(); !slices.Equal(got, []string{a}) {
		t.Fatalf("list with junk lines: %v", got)
	}
}
