package objectstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/objectstore/local"
	"github.com/deltabox/deltabox/objectstore/s3"
)

func TestOpenLocal(t *testing.T) {
	dir := t.TempDir()
	for _, uri := range []string{"file://" + dir, "file://localhost" + dir, dir} {
		st, err := objectstore.Open(context.Background(), uri)
		if err != nil {
			t.Fatalf("Open(%q): %v", uri, err)
		}
		ls, ok := st.(*local.Store)
		if !ok || ls.Root() != dir {
			t.Fatalf("Open(%q) = %T %v, want a local store rooted at %s", uri, st, st, dir)
		}
	}
}

func TestOpenS3(t *testing.T) {
	uri := "s3://bucket/some/prefix?endpoint=127.0.0.1:9&tls=false&region=eu-west-1&create_bucket=false"
	st, err := objectstore.Open(context.Background(), uri, objectstore.WithCredentials("a", "b"),
		objectstore.WithPartSize(8<<20), objectstore.WithConcurrency(2))
	if err != nil {
		t.Fatalf("Open(%q): %v", uri, err)
	}
	ss, ok := st.(*s3.Store)
	if !ok || ss.Bucket() != "bucket" {
		t.Fatalf("Open(%q) = %T, want an s3 store on bucket", uri, st)
	}
}

func TestOpenInvalid(t *testing.T) {
	for _, uri := range []string{
		"", "relative/path", "file://host/path", "file:relative", "ftp://x/y",
		"s3://bucket?tls=maybe", "s3://bucket?bogus=1", "s3://?endpoint=127.0.0.1:9", "://",
	} {
		st, err := objectstore.Open(context.Background(), uri)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || st != nil {
			t.Errorf("Open(%q) = %v, %v; want nil, ErrInvalidArgument", uri, st, err)
		}
	}
	_, err := objectstore.Open(context.Background(), "s3://b?endpoint=127.0.0.1:9", objectstore.WithPartSize(1<<20))
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Open with a 1 MiB part size: %v, want ErrInvalidArgument", err)
	}
}

func TestValidateKey(t *testing.T) {
	for _, k := range []string{"a", "a/b", "sha256/abc", ".hidden", "a/.b", "..x", "a b/ü"} {
		if err := objectstore.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q): %v", k, err)
		}
	}
	for _, k := range []string{"", "/a", "a/", "a//b", ".", "..", "a/../b", "a/.", "x\x00"} {
		if err := objectstore.ValidateKey(k); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidArgument", k, err)
		}
	}
	for _, p := range []string{"", "a", "a/", "a/b", "a/.", "a/.."} {
		if err := objectstore.ValidatePrefix(p); err != nil {
			t.Errorf("ValidatePrefix(%q): %v", p, err)
		}
	}
}
