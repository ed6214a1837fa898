package local_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/objectstore/local"
)

// TestLayout checks where objects land and that a failed Put leaves no temp file.
func TestLayout(t *testing.T) {
	root := t.TempDir()
	s, err := local.New(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, "a/b/c", strings.NewReader("hi"), 2); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "objects", "a", "b", "c"))
	if err != nil || string(b) != "hi" {
		t.Fatalf("object file: %q, %v", b, err)
	}
	if err := s.Put(ctx, "a/b/d", strings.NewReader("short"), 9); err == nil {
		t.Fatal("Put with a wrong size succeeded")
	}
	tmp, err := os.ReadDir(filepath.Join(root, "tmp"))
	if err != nil || len(tmp) != 0 {
		t.Fatalf("temp files left behind: %v, %v", tmp, err)
	}
}

// TestKeyPrefixConflict: "a" cannot be an object and a directory at once.
func TestKeyPrefixConflict(t *testing.T) {
	s, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, "a/b", bytes.NewReader(nil), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "a", bytes.NewReader(nil), 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Put(a) over directory a/: %v, want ErrConflict", err)
	}
	if err := s.Put(ctx, "a/b/c", bytes.NewReader(nil), 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Put(a/b/c) under object a/b: %v, want ErrConflict", err)
	}
}

// TestSymlinkNotAnObject: an object path that is a symlink (planted from outside) is not
// an object.
func TestSymlinkNotAnObject(t *testing.T) {
	root := t.TempDir()
	s, err := local.New(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "objects", "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(context.Background(), "link"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat of a symlink: %v, want ErrNotFound", err)
	}
	if infos, err := s.List(context.Background(), ""); err != nil || len(infos) != 0 {
		t.Fatalf("List lists a symlink: %v, %v", infos, err)
	}
}

func TestRelativeRoot(t *testing.T) {
	if _, err := local.New("relative"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("New(relative): %v, want ErrInvalidArgument", err)
	}
}

func TestGetDoesNotFollowSymlink(t *testing.T) {
	root := t.TempDir()
	s, err := local.New(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "objects", "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "link", objectstore.Range{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get of a symlink: %v, want ErrNotFound", err)
	}
}
