package criu

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
)

func imagesFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteMeta(dir, LocalMeta(Status{Version: 40101})); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"pages-1.img": string(bytes.Repeat([]byte{7}, 100000)), "core-1.img": "core", "inventory.img": "inv", "sub/x.img": "x"}
	for name, data := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestPackUnpackRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := imagesFixture(t)
	var a, b bytes.Buffer
	meta, err := Pack(ctx, src, &a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Pack(ctx, src, &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two packs of the same directory differ")
	}
	if names := tarNames(t, a.Bytes()); names[0] != MetaFile || names[1] != "core-1.img" {
		t.Fatalf("archive order %v", names)
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := Unpack(ctx, bytes.NewReader(a.Bytes()), dst); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pages-1.img", "sub/x.img", MetaFile} {
		want, _ := os.ReadFile(filepath.Join(src, name))
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs after unpack: %v", name, err)
		}
	}
	if got, err := ReadMeta(dst); err != nil || !got.Created.Equal(meta.Created) {
		t.Fatalf("meta after unpack %+v %v", got, err)
	}
	if err := Unpack(ctx, bytes.NewReader(a.Bytes()), dst); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("unpack over existing files: want exist error, got %v", err)
	}
}

func TestPackRefuses(t *testing.T) {
	ctx := context.Background()
	if _, err := Pack(ctx, t.TempDir(), &bytes.Buffer{}); !errdefs.IsNotFound(err) {
		t.Fatalf("no meta: want NotFound, got %v", err)
	}
	dir := imagesFixture(t)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link.img"))
	if _, err := Pack(ctx, dir, &bytes.Buffer{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("symlink: want InvalidArgument, got %v", err)
	}
}

func TestUnpackRefusesHostileEntries(t *testing.T) {
	cases := map[string]tar.Header{
		"dotdot":   {Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644},
		"nested":   {Name: "a/../../evil", Typeflag: tar.TypeReg, Mode: 0o644},
		"absolute": {Name: "/tmp/evil", Typeflag: tar.TypeReg, Mode: 0o644},
		"symlink":  {Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		"hardlink": {Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"},
		"chardev":  {Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		"fifo":     {Name: "p", Typeflag: tar.TypeFifo},
	}
	for name, hdr := range cases {
		root := t.TempDir()
		dir := filepath.Join(root, "out")
		err := Unpack(context.Background(), bytes.NewReader(hostileArchive(t, hdr)), dir)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want InvalidArgument, got %v", name, err)
		}
		if _, err := os.Lstat(filepath.Join(root, "evil")); err == nil {
			t.Errorf("%s: wrote outside the target", name)
		}
	}
	if err := Unpack(context.Background(), bytes.NewReader([]byte("not zstd")), t.TempDir()); !errdefs.IsInvalidArgument(err) {
		t.Errorf("garbage: want InvalidArgument, got %v", err)
	}
}

func hostileArchive(t *testing.T, hdr tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&hdr); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func tarNames(t *testing.T, archive []byte) []string {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			return names
		}
		names = append(names, h.Name)
	}
}
