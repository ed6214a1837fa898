package criu

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

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

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// bomb is a Pack-like archive holding files of size bytes of zeros each: tiny compressed.
func bomb(t *testing.T, files int, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest))
	tw := tar.NewWriter(zw)
	for i := range files {
		hdr := &tar.Header{Name: filepath.Join("d", string(rune('a'+i%26))+strconv.Itoa(i)), Typeflag: tar.TypeReg, Mode: 0o600, Size: size}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(tw, zeros{}, size); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestUnpackBounded(t *testing.T) {
	ctx := context.Background()
	src := imagesFixture(t)
	var a bytes.Buffer
	meta, err := Pack(ctx, src, &a)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Entries != 6 || meta.UnpackedBytes <= 100000 {
		t.Fatalf("Pack recorded %d entries, %d bytes", meta.Entries, meta.UnpackedBytes)
	}
	if err := Unpack(ctx, bytes.NewReader(a.Bytes()), t.TempDir(), WithLimits(meta.UnpackedBytes, meta.Entries)); err != nil {
		t.Fatalf("unpack within its recorded sizes: %v", err)
	}
	big := bomb(t, 1, 1<<30) // 1 GiB of zeros
	t.Logf("a %d-byte blob that unpacks to 1 GiB", len(big))
	dir := t.TempDir()
	err = Unpack(ctx, bytes.NewReader(big), dir, WithLimits(meta.UnpackedBytes, meta.Entries))
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "recorded") {
		t.Fatalf("zip bomb: want invalid argument naming the recorded size, got %v", err)
	}
	if n := dirBytes(t, dir); n > meta.UnpackedBytes {
		t.Errorf("the refused unpack wrote %d bytes", n)
	}
	many := bomb(t, 50, 1)
	if err := Unpack(ctx, bytes.NewReader(many), t.TempDir(), WithLimits(1<<20, 10)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "entries") {
		t.Fatalf("too many entries: want invalid argument, got %v", err)
	}
}

func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// chunkWriter records the size of each write.
type chunkWriter struct{ sizes []int }

func (w *chunkWriter) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return len(p), nil
}

// copyFull writes whole buffers however little each read returns, and a short source is an
// unexpected EOF, not a short file.
func TestCopyFullWritesWholeBuffers(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 10_000)
	var w chunkWriter
	if err := copyFull(&w, iotest.OneByteReader(bytes.NewReader(data)), int64(len(data)), make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if want := []int{4096, 4096, 1808}; !slices.Equal(w.sizes, want) {
		t.Fatalf("writes %v, want %v", w.sizes, want)
	}
	err := copyFull(&chunkWriter{}, bytes.NewReader(data[:100]), 200, make([]byte, 64))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a short source: %v, want io.ErrUnexpectedEOF", err)
	}
	err = copyFull(&chunkWriter{}, bytes.NewReader(nil), 1, make([]byte, 64))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("an empty source: %v, want io.ErrUnexpectedEOF", err)
	}
}
