package storetest

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/deltabox/deltabox/objectstore"
)

func testCASDedup(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	cas := objectstore.NewCAS(s)
	for _, n := range []int{0, 3000, 6 << 20} {
		b := data(n, 8)
		d := digest.FromBytes(b)
		if has, err := cas.Has(ctx, d); err != nil || has {
			t.Fatalf("Has(%s) before Put = %v, %v", d, has, err)
		}
		for i, want := range []bool{true, false, false} {
			size := int64(n)
			if i == 2 {
				size = -1
			}
			uploaded, err := cas.Put(ctx, d, streamOnly{bytesReader(b)}, size)
			if err != nil || uploaded != want {
				t.Fatalf("CAS Put #%d of %d bytes = %v, %v; want uploaded=%v", i+1, n, uploaded, err, want)
			}
		}
		checkBytes(t, "CAS Get", readAll(t, cas, d), b)
		if has, err := cas.Has(ctx, d); err != nil || !has {
			t.Fatalf("Has(%s) after Put = %v, %v", d, has, err)
		}
	}
	key, _ := cas.Key(digest.FromBytes(nil))
	if !strings.HasPrefix(key, objectstore.DefaultCASPrefix) {
		t.Fatalf("CAS key %q lacks prefix %q", key, objectstore.DefaultCASPrefix)
	}
}

func readAll(t *testing.T, cas *objectstore.CAS, d digest.Digest) []byte {
	t.Helper()
	rc, err := cas.Get(context.Background(), d)
	if err != nil {
		t.Fatalf("CAS Get(%s): %v", d, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("CAS Get(%s): read: %v", d, err)
	}
	return b
}

// testCASMismatchOnRead stores wrong bytes under a blob's key behind the CAS's back: a
// reader must never reach io.EOF with them.
func testCASMismatchOnRead(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	cas := objectstore.NewCAS(s)
	for _, n := range []int{10, 3 << 20} {
		good := data(n, 9)
		bad := append([]byte(nil), good...)
		bad[n/2] ^= 1
		d := digest.FromBytes(good)
		key, err := cas.Key(d)
		if err != nil {
			t.Fatal(err)
		}
		put(t, s, key, bad, int64(n))
		rc, err := cas.Get(ctx, d)
		if err != nil {
			t.Fatalf("CAS Get: %v", err)
		}
		_, err = io.ReadAll(rc)
		rc.Close()
		wantErr(t, "reading tampered blob", err, objectstore.ErrDigestMismatch)
		wantErr(t, "reading tampered blob", err, errdefs.ErrDataLoss)
		if !strings.Contains(err.Error(), d.String()) {
			t.Fatalf("mismatch error %q does not name digest %s", err, d)
		}
	}
	_, err := cas.Get(ctx, digest.FromString("missing"))
	wantErr(t, "CAS Get missing", err, errdefs.ErrNotFound)
}

func testCASMismatchOnPut(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	cas := objectstore.NewCAS(s)
	for _, n := range []int{10, 6 << 20, 11 << 20} {
		b := data(n, 10)
		d := digest.FromString("something else")
		for _, size := range []int64{int64(n), -1} {
			uploaded, err := cas.Put(ctx, d, streamOnly{bytesReader(b)}, size)
			if uploaded || !errors.Is(err, objectstore.ErrDigestMismatch) {
				t.Fatalf("CAS Put of %d wrong bytes = %v, %v; want ErrDigestMismatch", n, uploaded, err)
			}
			if has, err := cas.Has(ctx, d); err != nil || has {
				t.Fatalf("blob visible after a rejected Put: %v, %v", has, err)
			}
		}
	}
}

func testCASInvalidDigest(t *testing.T, s objectstore.Store) {
	cas := objectstore.NewCAS(s)
	for _, d := range []digest.Digest{"", "sha256:xyz", "md5:d41d8cd98f00b204e9800998ecf8427e", "sha256:../../etc"} {
		_, err := cas.Put(context.Background(), d, bytesReader(nil), 0)
		wantErr(t, "CAS Put digest "+string(d), err, errdefs.ErrInvalidArgument)
		_, err = cas.Get(context.Background(), d)
		wantErr(t, "CAS Get digest "+string(d), err, errdefs.ErrInvalidArgument)
	}
}
