package pool

import (
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/deltabox/deltabox/internal/testutil"
)

// cgroup2Mount returns the node's first cgroup2 mount.
func cgroup2Mount(t *testing.T) *mountinfo.Info {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil || len(mounts) == 0 {
		t.Fatalf("no cgroup2 mount on this node (%v): the daemon's cgroup tuning has nothing to act on", err)
	}
	return mounts[0]
}

// TestFavorDynMods: the cgroup2 hierarchy gets favordynmods, keeps the flag options it had
// (a reconfiguration clears those it is not given) and its mount flags; a second call
// changes nothing. The node's options are put back as they were at the end.
func TestFavorDynMods(t *testing.T) {
	testutil.RequiresRoot(t)
	m := cgroup2Mount(t)
	orig := keptCgroup2Flags(strings.Split(m.VFSOptions, ","))
	t.Cleanup(func() {
		if err := reconfigureCgroup2(m.Mountpoint, orig); err != nil {
			t.Errorf("put the cgroup2 options back: %v", err)
		}
	})
	// A flag option harmless on this node, set beside the absence of favordynmods.
	start := append(slices.DeleteFunc(slices.Clone(orig), func(f string) bool { return f == "favordynmods" }), "memory_localevents")
	if err := reconfigureCgroup2(m.Mountpoint, start); err != nil {
		t.Fatal(err)
	}
	changed, err := FavorDynMods()
	if err != nil || !slices.Contains(changed, m.Mountpoint) {
		t.Fatalf("FavorDynMods = %v, %v; want %s changed", changed, err, m.Mountpoint)
	}
	after := cgroup2Mount(t)
	opts := strings.Split(after.VFSOptions, ",")
	for _, want := range append(start, "favordynmods") {
		if !slices.Contains(opts, want) {
			t.Fatalf("cgroup2 options after FavorDynMods: %s; want %s kept or set", after.VFSOptions, want)
		}
	}
	if after.Options != m.Options {
		t.Fatalf("mount flags moved: %s, were %s", after.Options, m.Options)
	}
	if again, err := FavorDynMods(); err != nil || len(again) != 0 {
		t.Fatalf("second FavorDynMods = %v, %v; want nothing changed", again, err)
	}
}
