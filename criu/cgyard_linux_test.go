//go:build linux

package criu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool"
)

func TestYardNames(t *testing.T) {
	hybrid := "12:cpu,cpuacct:/a\n11:name=systemd:/\n3:memory:/x\n0::/deltabox/sb\n"
	got, err := yardNames([]byte(hybrid))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, h := range got {
		dirs = append(dirs, h.dir)
	}
	if want := []string{"cpu,cpuacct", "systemd", "memory", "unified"}; !slices.Equal(dirs, want) {
		t.Fatalf("yard dirs %v, want %v (CRIU's names: controllers joined, name= dropped, unified for cgroup2)", dirs, want)
	}
	for _, bad := range []string{"0:..:/\n", "no colons\n", "1:name=a/b:/\n"} {
		if _, err := yardNames([]byte(bad)); err == nil {
			t.Errorf("yardNames(%q) took it", bad)
		}
	}
}

// cgroup2Options returns the super options of the node's cgroup2 mounts outside any yard.
func cgroup2Options(t *testing.T) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if strings.Contains(m.Mountpoint, "yard/") {
			continue
		}
		out = append(out, m.Mountpoint+" "+m.VFSOptions)
	}
	return out
}

// newYard prepares a yard under a temp dir and unmounts it when the test ends.
func newYard(t *testing.T) (string, []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "yard")
	bound, err := PrepareCgroupYard(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if err := unmountYardEntry(filepath.Join(dir, e.Name())); err != nil {
				t.Error(err)
			}
		}
	})
	return dir, bound
}

// TestPrepareCgroupYard: the yard holds one bind mount per hierarchy of /proc/self/cgroup, of
// that hierarchy's root; making it again keeps what is right, mounts a hierarchy's directory
// that is not mounted (CRIU would take it for the hierarchy) and removes one of no hierarchy,
// and neither changes the node's cgroup2 flags.
func TestPrepareCgroupYard(t *testing.T) {
	testutil.RequiresRoot(t)
	before := cgroup2Options(t)
	dir, bound := newYard(t)
	procCgroup, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	names, err := yardNames(procCgroup)
	if err != nil {
		t.Fatal(err)
	}
	if len(bound) != len(names) || !slices.Contains(bound, "unified") {
		t.Fatalf("bound %v of the hierarchies %v", bound, names)
	}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range names {
		p := filepath.Join(dir, h.dir)
		var st, src unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(p, &fs); err != nil {
			t.Fatal(err)
		}
		if fs.Type != unix.CGROUP_SUPER_MAGIC && fs.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Fatalf("%s is not a cgroup filesystem (type %#x)", p, fs.Type)
		}
		var hmounts []*mountinfo.Info
		for _, m := range mounts {
			if (m.FSType == "cgroup" || m.FSType == "cgroup2") && !strings.HasPrefix(m.Mountpoint, dir) {
				hmounts = append(hmounts, m)
			}
		}
		if err := unix.Stat(hierarchyRoot(hmounts, h), &src); err != nil {
			t.Fatal(err)
		}
		if st.Dev != src.Dev || st.Ino != src.Ino {
			t.Fatalf("%s is not the root of hierarchy %s", p, h.dir)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "stale"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(filepath.Join(dir, "unified"), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	again, err := PrepareCgroupYard(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, bound) {
		t.Fatalf("again bound %v, first %v", again, bound)
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); !os.IsNotExist(err) {
		t.Fatalf("a stale yard directory survived: %v", err)
	}
	n := 0
	for _, m := range mustMounts(t) {
		if strings.HasPrefix(m.Mountpoint, dir+"/") {
			n++
		}
	}
	if n != len(bound) {
		t.Fatalf("%d mounts in the yard after making it twice, want %d", n, len(bound))
	}
	if mounted, err := mountinfo.Mounted(filepath.Join(dir, "unified")); !mounted {
		t.Fatalf("the unmounted cgroup2 directory was left as it was: %v", err)
	}
	if after := cgroup2Options(t); !slices.Equal(after, before) {
		t.Fatalf("the yard changed the node's cgroup2 options: %v -> %v", before, after)
	}
}

func mustMounts(t *testing.T) []*mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestCRIUKeepsTheNodesCgroup2Flags: a dump and a restore through the yard leave the node's
// cgroup2 flags as they were. Without it CRIU mounts cgroup2 afresh for each, which in the
// initial cgroup namespace sets the hierarchy's flags to that mount's (none): favordynmods
// (the daemon's default) was off after the first L3 checkpoint.
func TestCRIUKeepsTheNodesCgroup2Flags(t *testing.T) {
	e := newEnv(t)
	if _, err := pool.FavorDynMods(); err != nil {
		testutil.SkipOrFail(t, "this kernel has no favordynmods: %v", err)
	}
	want := cgroup2Options(t)
	yard, _ := newYard(t)
	sb := e.newSandbox(t, busyboxImage, counterScript, Options{TCPEstablished: true, CgroupYard: yard})
	sb.waitCount(t, "counter to start", func(n int) bool { return n > 2 })
	images := filepath.Join(t.TempDir(), "images")
	if _, err := e.cp.Dump(e.ctx, sb.id, images); err != nil {
		t.Fatal(err)
	}
	if got := cgroup2Options(t); !slices.Equal(got, want) {
		t.Fatalf("after a dump the node's cgroup2 options are %v, were %v", got, want)
	}
	e.kill(t, sb)
	e.restore(t, sb, images)
	if got := cgroup2Options(t); !slices.Equal(got, want) {
		t.Fatalf("after a restore the node's cgroup2 options are %v, were %v", got, want)
	}
	sb.waitCount(t, "restored counter to keep counting", func(n int) bool { return n > 0 })
}
