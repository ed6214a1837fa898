package pool

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"golang.org/x/sys/unix"
)

func TestParseRootChildren(t *testing.T) {
	const info = `812 700 0:60 / / rw,relatime - overlay overlay rw,lowerdir=/a:/b,upperdir=/u,workdir=/w
813 812 0:64 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
814 812 0:65 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
815 814 0:66 / /dev/pts rw,nosuid,noexec,relatime - devpts devpts rw
816 812 0:67 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
817 812 254:1 /usr/bin/deltabox-init /.deltabox/init ro,nosuid,nodev - ext4 /dev/vda rw
818 812 254:1 /x/run /.deltabox/run rw,nosuid,nodev,noexec - ext4 /dev/vda rw
819 813 0:64 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw
820 812 254:1 /x/a\040b /with\040space rw - ext4 /dev/vda rw
`
	got, err := parseRootChildren([]byte(info))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/proc", "/dev", "/sys", "/.deltabox/init", "/.deltabox/run", "/with space"}
	if !slices.Equal(got, want) {
		t.Errorf("children %q, want %q", got, want)
	}
	if _, err := parseRootChildren([]byte("813 812 0:64 / /proc rw - proc proc rw\n")); err == nil {
		t.Error("a mountinfo without a root mount passed")
	}
	for _, bad := range []string{
		"812 700 0:60 / / rw - overlay overlay rw\n821 812 0:1 / /.deltabox rw - tmpfs tmpfs rw\n",
		"812 700 0:60 / / rw - overlay overlay rw\n821 812 0:1 / /a/../b rw - tmpfs tmpfs rw\n",
	} {
		if _, err := parseRootChildren([]byte(bad)); !errors.Is(err, errNotReroutable) {
			t.Errorf("%q: %v, want errNotReroutable", bad, err)
		}
	}
}

func TestPristineUpper(t *testing.T) {
	fresh := func(t *testing.T) string {
		dir := t.TempDir()
		for _, d := range []string{".deltabox/run", "proc", "etc"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, ".deltabox/init"), nil, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := fresh(t)
	for _, name := range []string{"trusted.overlay.uuid", "trusted.overlay.impure", "trusted.overlay.origin"} {
		if err := unix.Lsetxattr(dir, name, []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := pristineUpper(dir); err != nil {
		t.Fatalf("a task's mount points: %v", err)
	}
	for name, spoil := range map[string]func(dir string) error{
		"a file with data": func(dir string) error { return os.WriteFile(filepath.Join(dir, "etc/hosts"), []byte("x"), 0o644) },
		"a symlink":        func(dir string) error { return os.Symlink("/etc", filepath.Join(dir, "link")) },
		"a fifo":           func(dir string) error { return mkfifo(filepath.Join(dir, "etc/fifo")) },
		"an opaque dir": func(dir string) error {
			return unix.Lsetxattr(filepath.Join(dir, "etc"), "trusted.overlay.opaque", []byte("y"), 0)
		},
		"a metacopy": func(dir string) error {
			return unix.Lsetxattr(filepath.Join(dir, ".deltabox/init"), "trusted.overlay.metacopy", nil, 0)
		},
	} {
		dir := fresh(t)
		if err := spoil(dir); err != nil {
			t.Fatal(err)
		}
		if err := pristineUpper(dir); !errors.Is(err, errNotReroutable) {
			t.Errorf("%s in the upper dir: %v, want errNotReroutable", name, err)
		}
	}
}

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

func TestCommonParent(t *testing.T) {
	for _, c := range []struct {
		dirs []string
		want string
	}{
		{[]string{"/r/forklowers/flm-1", "/r/snapshots/2/fs", "/r/snapshots/1/fs"}, "/r"},
		{[]string{"/r/snapshots/2/fs", "/r/snapshots/1/fs"}, "/r/snapshots"},
		{[]string{"/r/snapshots/1/fs"}, "/r/snapshots/1"},
		{[]string{"/ab/x", "/a/y"}, "/"},
	} {
		if got := commonParent(c.dirs); got != c.want {
			t.Errorf("commonParent(%q) = %q, want %q", c.dirs, got, c.want)
		}
	}
}

func TestIndexOff(t *testing.T) {
	ovl := func(opts ...string) []mount.Mount {
		return []mount.Mount{{Type: "overlay", Source: "overlay", Options: append([]string{"workdir=/w", "upperdir=/u", "lowerdir=/l"}, opts...)}}
	}
	if err := indexOff(ovl("index=off")); err != nil {
		t.Errorf("index=off: %v", err)
	}
	for name, ms := range map[string][]mount.Mount{
		"index=on":             ovl("index=on"),
		"index=off then on":    ovl("index=off", "index=on"),
		"two mounts":           append(ovl("index=off"), ovl("index=off")...),
		"not an overlay mount": {{Type: "bind", Source: "/x", Options: []string{"rbind", "index=off"}}},
	} {
		if err := indexOff(ms); !errors.Is(err, errNotReroutable) {
			t.Errorf("%s: %v, want errNotReroutable", name, err)
		}
	}
}
