package rootfs

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func mkRoot(t *testing.T) (string, *Root) {
	t.Helper()
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return dir, r
}

func write(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

func TestArchiveExtractRoundTrip(t *testing.T) {
	src, sr := mkRoot(t)
	write(t, filepath.Join(src, "d/a.txt"), "alpha")
	write(t, filepath.Join(src, "d/sub/b.txt"), "beta")
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "d/link")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := sr.Archive("d", &buf); err != nil {
		t.Fatal(err)
	}
	dst, dr := mkRoot(t)
	res, err := dr.Extract("/copy", tar.NewReader(&buf), ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 5 || res.Bytes != 9 {
		t.Errorf("want 5 entries and 9 bytes, got %+v", res)
	}
	got, err := os.ReadFile(filepath.Join(dst, "copy/sub/b.txt"))
	if err != nil || string(got) != "beta" {
		t.Fatalf("b.txt: %q %v", got, err)
	}
	if target, _ := os.Readlink(filepath.Join(dst, "copy/link")); target != "/etc/passwd" {
		t.Errorf("symlink target %q", target)
	}
	if st, _ := os.Stat(filepath.Join(dst, "copy/a.txt")); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", st.Mode())
	}
}

func TestExtractIntoExistingDir(t *testing.T) {
	dst, dr := mkRoot(t)
	os.Mkdir(filepath.Join(dst, "in"), 0o755)
	if _, err := dr.Extract("/in", tarOf(t, "f.txt", "x"), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, "in/f.txt")); err != nil {
		t.Fatal(err)
	}
}

func TestRefusesDotDotAndSymlinks(t *testing.T) {
	outside := t.TempDir()
	canary := filepath.Join(outside, "canary")
	write(t, canary, "keep")
	dst, dr := mkRoot(t)
	if err := os.Symlink(outside, filepath.Join(dst, "escape")); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func() error{
		"dest with ..": func() error { _, err := dr.Extract("/../x", tarOf(t, "f", "x"), ExtractOptions{}); return err },
		"dest through symlink": func() error {
			_, err := dr.Extract("/escape/canary", tarOf(t, "f", "x"), ExtractOptions{})
			return err
		},
		"entry with ..":           func() error { _, err := dr.Extract("/d", tarOf(t, "d/../../x", "x"), ExtractOptions{}); return err },
		"archive through symlink": func() error { return dr.Archive("escape/canary", &bytes.Buffer{}) },
	}
	for name, fn := range cases {
		err := fn()
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want invalid argument, got %v", name, err)
		}
	}
	if got, _ := os.ReadFile(canary); string(got) != "keep" {
		t.Fatalf("canary changed: %q", got)
	}
	// A final-component symlink is replaced, not followed.
	if _, err := dr.Extract("/escape", tarOf(t, "f", "new"), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(canary); string(got) != "keep" {
		t.Fatalf("canary changed through a final symlink: %q", got)
	}
	if st, _ := os.Lstat(filepath.Join(dst, "escape")); !st.Mode().IsRegular() {
		t.Fatalf("symlink not replaced by a file: %v", st.Mode())
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{"/": "", "/a/b/": "a/b", "a//b/./c": "a/b/c"} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := CleanPath("/a/../b"); err == nil || !strings.Contains(err.Error(), "climbs out") {
		t.Errorf("want climbs-out error, got %v", err)
	}
}

func tarOf(t *testing.T, name, content string) *tar.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	tw.Write([]byte(content))
	tw.Close()
	return tar.NewReader(&buf)
}
