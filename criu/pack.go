package criu

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// noFollow makes Unpack refuse to write through a symlink planted in the target directory.
const noFollow = unix.O_NOFOLLOW

// packEntry is one file or directory of an images directory, relative to it.
type packEntry struct {
	rel  string
	info fs.FileInfo
}

// Pack writes the images directory as a zstd-compressed tar to w: MetaFile first, then every
// other file and directory in lexical order, with zeroed owners and times, so equal
// directories give equal archives. It refuses anything but regular files and directories.
func Pack(ctx context.Context, imagesDir string, w io.Writer) (Meta, error) {
	meta, err := ReadMeta(imagesDir)
	if err != nil {
		return meta, fmt.Errorf("pack %s: %w", imagesDir, err)
	}
	entries, err := listImages(imagesDir)
	if err != nil {
		return meta, err
	}
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	if err != nil {
		return meta, fmt.Errorf("zstd writer: %w", err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			zw.Close()
			return meta, err
		}
		if err := packOne(tw, imagesDir, e); err != nil {
			zw.Close()
			return meta, err
		}
	}
	if err := tw.Close(); err != nil {
		zw.Close()
		return meta, fmt.Errorf("pack %s: %w", imagesDir, err)
	}
	if err := zw.Close(); err != nil {
		return meta, fmt.Errorf("pack %s: %w", imagesDir, err)
	}
	meta.Entries = len(entries)
	for _, e := range entries {
		if e.info.Mode().IsRegular() {
			meta.UnpackedBytes += e.info.Size()
		}
	}
	return meta, nil
}

// listImages walks dir and returns its entries, MetaFile first, the rest sorted.
func listImages(dir string) ([]packEntry, error) {
	var out []packEntry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("%s is neither a regular file nor a directory (%s): %w", p, info.Mode().Type(), errdefs.ErrInvalidArgument)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		out = append(out, packEntry{rel: filepath.ToSlash(rel), info: info})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list criu images in %s: %w", dir, err)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if (out[i].rel == MetaFile) != (out[j].rel == MetaFile) {
			return out[i].rel == MetaFile
		}
		return out[i].rel < out[j].rel
	})
	return out, nil
}

func packOne(tw *tar.Writer, dir string, e packEntry) error {
	hdr := &tar.Header{
		Name:    e.rel,
		Mode:    int64(e.info.Mode().Perm()),
		ModTime: time.Unix(0, 0),
		Format:  tar.FormatPAX,
	}
	if e.info.IsDir() {
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.rel+"/"
		return tw.WriteHeader(hdr)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, e.info.Size()
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(e.rel)))
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("pack %s: %w", e.rel, err)
	}
	if _, err := io.CopyN(tw, f, e.info.Size()); err != nil {
		return fmt.Errorf("pack %s (did it change while packing?): %w", e.rel, err)
	}
	return nil
}

// Default bounds of Unpack when no WithLimits is given.
const (
	DefaultMaxUnpackedBytes = 16 << 30
	DefaultMaxEntries       = 1 << 16
	maxZstdWindow           = 64 << 20 // Pack's encoder uses far less
)

// unpackLimits bound what an archive may unpack to.
type unpackLimits struct {
	bytes   int64 // file content, all files together; also each file's bound
	entries int   // files and directories
}

// UnpackOpt configures Unpack.
type UnpackOpt func(*unpackLimits)

// WithLimits bounds an Unpack by what Pack recorded (Meta.UnpackedBytes, Meta.Entries): more
// content or more entries than that is refused before it is written.
func WithLimits(bytes int64, entries int) UnpackOpt {
	return func(l *unpackLimits) { l.bytes, l.entries = bytes, entries }
}

// Unpack extracts an archive written by Pack into dir (created if missing; existing files are
// never overwritten). It refuses entries that would land outside dir, links, devices and any
// other special file, and archives beyond its limits (a small blob that decompresses to
// gigabytes), with errdefs.ErrInvalidArgument.
func Unpack(ctx context.Context, r io.Reader, dir string, opts ...UnpackOpt) error {
	lim := unpackLimits{bytes: DefaultMaxUnpackedBytes, entries: DefaultMaxEntries}
	for _, o := range opts {
		o(&lim)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("unpack: zstd: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var written int64
	buf := make([]byte, unpackBuffer)
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unpack: read archive: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if n >= lim.entries {
			return fmt.Errorf("unpack: the archive holds more than the %d entries recorded for it: %w", lim.entries, errdefs.ErrInvalidArgument)
		}
		if hdr.Size < 0 || hdr.Size > lim.bytes-written {
			return fmt.Errorf("unpack: entry %q of %d bytes takes the archive past the %d bytes recorded for it: %w",
				hdr.Name, hdr.Size, lim.bytes, errdefs.ErrInvalidArgument)
		}
		written += hdr.Size
		if err := unpackOne(tr, hdr, dir, buf); err != nil {
			return err
		}
	}
}

// unpackBuffer is the size of Unpack's writes: on a tmpfs mounted with huge pages
// (orchestrator's restore staging) a write of 1 MiB goes to large folios, and 50 MiB written
// so take 17-21 ms and 9-11 ms to read back (CRIU's page reads), against 22 and 17 ms in
// writes of 32 KiB; on ext4 the write size made no clear difference (22-33 ms to write).
const unpackBuffer = 1 << 20

// copyFull copies size bytes from r to w in writes of len(buf) (the last one shorter),
// however little each read returns (the zstd decoder returns a block at a time: *os.File's
// ReadFrom and io.CopyBuffer would write each as it comes). A short r is io.ErrUnexpectedEOF.
func copyFull(w io.Writer, r io.Reader, size int64, buf []byte) error {
	for size > 0 {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size)])
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		size -= int64(n)
	}
	return nil
}

func unpackOne(tr *tar.Reader, hdr *tar.Header, dir string, buf []byte) error {
	rel, err := safeRel(hdr.Name)
	if err != nil {
		return err
	}
	target := filepath.Join(dir, rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("unpack %s: %w", hdr.Name, err)
		}
		return nil
	case tar.TypeReg:
		return unpackFile(tr, target, hdr, buf)
	default:
		return fmt.Errorf("unpack: entry %q has type %q: only regular files and directories are allowed: %w", hdr.Name, hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
}

// safeRel cleans an archive name and refuses absolute names and names that leave the root.
func safeRel(name string) (string, error) {
	clean := path.Clean(strings.TrimSuffix(name, "/"))
	if name == "" || path.IsAbs(name) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(name, "\x00") {
		return "", fmt.Errorf("unpack: entry %q escapes the images directory: %w", name, errdefs.ErrInvalidArgument)
	}
	return filepath.FromSlash(clean), nil
}

func unpackFile(tr *tar.Reader, target string, hdr *tar.Header, buf []byte) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		return fmt.Errorf("unpack %s: %w", hdr.Name, err)
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, os.FileMode(hdr.Mode).Perm()|0o600)
	if err != nil {
		return fmt.Errorf("unpack %s: %w", hdr.Name, err)
	}
	if err := copyFull(f, tr, hdr.Size, buf); err != nil {
		f.Close()
		return fmt.Errorf("unpack %s: %v: %w", hdr.Name, err, errdefs.ErrInvalidArgument)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("unpack %s: %w", hdr.Name, err)
	}
	return nil
}
