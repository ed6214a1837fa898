package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

// TestResolveStaysInRoot follows a sandbox's symlinks the way its own processes see them,
// and never out of the root: absolute targets start at the root, ".." stops there, loops end.
func TestResolveStaysInRoot(t *testing.T) {
	outside := t.TempDir()
	dir := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"usr/bin", "etc", "home/u"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"bin":         "usr/bin",         // Debian's merged /usr
		"abs":         "/usr/bin",        // absolute: from the sandbox's root
		"up":          "../../../../etc", // climbs past the root: stops at it
		"host":        outside,           // a host path: taken inside the root
		"home/u/back": "../../usr",       // relative to its own directory
		"loop1":       "loop2",
		"loop2":       "loop1",
		"usr/bin/sh":  "dash", // a final symlink
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cases := []struct {
		in         string
		followLast bool
		want       string
		fails      bool
	}{
		{in: "bin/sh", want: "usr/bin/sh"},
		{in: "bin/sh", followLast: true, want: "usr/bin/dash"},
		{in: "abs/x", want: "usr/bin/x"},
		{in: "up/passwd", want: "etc/passwd"},
		{in: "host/x", want: filepath.Join(outside, "x")[1:]}, // inside the root, where it does not exist
		{in: "home/u/back/bin", want: "usr/bin"},
		{in: "bin", want: "bin"},
		{in: "bin", followLast: true, want: "usr/bin"},
		{in: "missing/../../x", want: "x"},
		{in: "loop1/x", fails: true},
	}
	for _, c := range cases {
		got, err := r.Resolve(c.in, c.followLast)
		switch {
		case c.fails && err == nil:
			t.Errorf("Resolve(%q) = %q, want an error", c.in, got)
		case !c.fails && (err != nil || got != c.want):
			t.Errorf("Resolve(%q, %v) = %q, %v; want %q", c.in, c.followLast, got, err, c.want)
		}
	}
}
