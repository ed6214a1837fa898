package storetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore"
)

func testRoundTrip(t *testing.T, s objectstore.Store) {
	sizes := []int{0, 1, 4096, 5 << 20, 10 << 20, 12<<20 + 3}
	for i, n := range sizes {
		for _, known := range []bool{true, false} {
			key := fmt.Sprintf("rt/%d-%v", n, known)
			b := data(n, uint64(i))
			size := int64(-1)
			if known {
				size = int64(n)
			}
			put(t, s, key, b, size)
			checkBytes(t, key, get(t, s, key, objectstore.Range{}), b)
		}
	}
}

func testRange(t *testing.T, s objectstore.Store) {
	b := data(1<<20+5, 1)
	n := int64(len(b))
	put(t, s, "range/obj", b, n)
	ok := []objectstore.Range{{}, {Offset: 0, Length: 10}, {Offset: 100, Length: 1000},
		{Offset: n - 10}, {Offset: n - 10, Length: 100}, {Offset: n - 1, Length: 1}, {Offset: 1, Length: n + 7}}
	for _, r := range ok {
		end := n
		if r.Length > 0 {
			end = min(n, r.Offset+r.Length)
		}
		checkBytes(t, fmt.Sprintf("range %+v", r), get(t, s, "range/obj", r), b[r.Offset:end])
	}
	for _, r := range []objectstore.Range{{Offset: n}, {Offset: n + 5, Length: 1}, {Offset: -1}} {
		_, err := s.Get(context.Background(), "range/obj", r)
		wantErr(t, fmt.Sprintf("Get range %+v of %d bytes", r, n), err, errdefs.ErrInvalidArgument)
	}
}

func testRangeEmpty(t *testing.T, s objectstore.Store) {
	put(t, s, "empty", nil, 0)
	for _, r := range []objectstore.Range{{}, {Offset: 0, Length: 5}} {
		if got := get(t, s, "empty", r); len(got) != 0 {
			t.Fatalf("range %+v of empty object: got %d bytes", r, len(got))
		}
	}
	_, err := s.Get(context.Background(), "empty", objectstore.Range{Offset: 1})
	wantErr(t, "Get offset 1 of empty object", err, errdefs.ErrInvalidArgument)
}

func testStat(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	before := time.Now().Add(-2 * time.Second)
	put(t, s, "stat/a", data(12345, 2), -1)
	after := time.Now().Add(2 * time.Second)
	info, err := s.Stat(ctx, "stat/a")
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if info.Key != "stat/a" || info.Size != 12345 {
		t.Fatalf("Stat = %+v, want key stat/a size 12345", info)
	}
	if info.ModTime.Before(before) || info.ModTime.After(after) {
		t.Fatalf("Stat ModTime %v not within [%v, %v]", info.ModTime, before, after)
	}
	requireAbsent(t, s, "stat/missing")
	requireAbsent(t, s, "stat") // a "directory" is not an object
	_, err = s.Get(ctx, "stat/missing", objectstore.Range{})
	wantErr(t, "Get missing", err, errdefs.ErrNotFound)
}

func testList(t *testing.T, s objectstore.Store) {
	keys := []string{"a/1", "a/2", "a/b/3", "ab", "b", "a-c"}
	for i, k := range keys {
		put(t, s, k, data(i+1, 3), int64(i+1))
	}
	cases := map[string][]string{
		"":     {"a-c", "a/1", "a/2", "a/b/3", "ab", "b"},
		"a/":   {"a/1", "a/2", "a/b/3"},
		"a":    {"a-c", "a/1", "a/2", "a/b/3", "ab"},
		"a/b":  {"a/b/3"},
		"a/b/": {"a/b/3"},
		"zz":   nil,
		"zz/":  nil,
		"b/":   nil,
	}
	for prefix, want := range cases {
		infos, err := s.List(context.Background(), prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
			if wantSize := int64(slices.Index(keys, in.Key) + 1); in.Size != wantSize {
				t.Fatalf("List(%q): %s has size %d, want %d", prefix, in.Key, in.Size, wantSize)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("List(%q) = %q, want %q", prefix, got, want)
		}
	}
}

func testDelete(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	put(t, s, "del/x/1", []byte("one"), 3)
	put(t, s, "del/x/2", []byte("two"), 3)
	if err := s.Delete(ctx, "del/x/1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	requireAbsent(t, s, "del/x/1")
	_, err := s.Get(ctx, "del/x/1", objectstore.Range{})
	wantErr(t, "Get after Delete", err, errdefs.ErrNotFound)
	wantErr(t, "second Delete", s.Delete(ctx, "del/x/1"), errdefs.ErrNotFound)
	wantErr(t, "Delete of a prefix", s.Delete(ctx, "del/x"), errdefs.ErrNotFound)
	checkBytes(t, "sibling after Delete", get(t, s, "del/x/2", objectstore.Range{}), []byte("two"))
	if err := s.Delete(ctx, "del/x/2"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if infos, err := s.List(ctx, "del/"); err != nil || len(infos) != 0 {
		t.Fatalf("List after deleting everything = %v, %v; want empty", infos, err)
	}
	put(t, s, "del/x/1", []byte("again"), 5) // parents pruned by Delete come back
	checkBytes(t, "put after Delete", get(t, s, "del/x/1", objectstore.Range{}), []byte("again"))
}

func testOverwrite(t *testing.T, s objectstore.Store) {
	for i, n := range []int{100, 6 << 20, 10, 0} {
		b := data(n, uint64(10+i))
		put(t, s, "ow", b, int64(n))
		checkBytes(t, fmt.Sprintf("overwrite %d", i), get(t, s, "ow", objectstore.Range{}), b)
		info, err := s.Stat(context.Background(), "ow")
		if err != nil || info.Size != int64(n) {
			t.Fatalf("Stat after overwrite %d = %+v, %v; want size %d", i, info, err, n)
		}
	}
}

func testSizeMismatch(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	for _, c := range []struct{ n, size int }{{5, 10}, {5, 3}, {6 << 20, 6<<20 + 1}, {6 << 20, 5 << 20}} {
		key := fmt.Sprintf("sm/%d-%d", c.n, c.size)
		err := s.Put(ctx, key, streamOnly{bytesReader(data(c.n, 4))}, int64(c.size))
		wantErr(t, fmt.Sprintf("Put %d bytes declared %d", c.n, c.size), err, errdefs.ErrInvalidArgument)
		requireAbsent(t, s, key)
	}
}

var errBoom = errors.New("storetest: reader failed on purpose")

// failingReader yields n bytes of data, then fails.
type failingReader struct{}

func newFailingReader(n int) io.Reader {
	return io.MultiReader(io.LimitReader(bytesReader(data(n, 5)), int64(n)), failingReader{})
}

func (failingReader) Read([]byte) (int, error) { return 0, errBoom }

func testFailingReader(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	put(t, s, "fr/kept", []byte("old"), 3)
	for _, n := range []int{0, 1000, 6 << 20, 11 << 20} {
		for _, key := range []string{fmt.Sprintf("fr/new-%d", n), "fr/kept"} {
			err := s.Put(ctx, key, newFailingReader(n), -1)
			wantErr(t, fmt.Sprintf("Put with reader failing after %d bytes", n), err, errBoom)
		}
		requireAbsent(t, s, fmt.Sprintf("fr/new-%d", n))
		checkBytes(t, "object kept after failed overwrite", get(t, s, "fr/kept", objectstore.Range{}), []byte("old"))
	}
}

// InvalidKeys lists keys every Store must reject.
var InvalidKeys = []string{"", "/abs", "a//b", "a/../b", "..", ".", "../x", "a/", "a/./b", "a\x00b", "a/..", string(make([]byte, objectstore.MaxKeyLen+1))}

func testInvalidKeys(t *testing.T, s objectstore.Store) {
	ctx := context.Background()
	for _, key := range InvalidKeys {
		what := fmt.Sprintf("key %q", key)
		wantErr(t, what+" Put", s.Put(ctx, key, bytesReader([]byte("x")), 1), errdefs.ErrInvalidArgument)
		_, err := s.Get(ctx, key, objectstore.Range{})
		wantErr(t, what+" Get", err, errdefs.ErrInvalidArgument)
		_, err = s.Stat(ctx, key)
		wantErr(t, what+" Stat", err, errdefs.ErrInvalidArgument)
		wantErr(t, what+" Delete", s.Delete(ctx, key), errdefs.ErrInvalidArgument)
	}
	for _, prefix := range []string{"/a", "a//", "../", "a/../b", "x\x00"} {
		_, err := s.List(ctx, prefix)
		wantErr(t, fmt.Sprintf("List(%q)", prefix), err, errdefs.ErrInvalidArgument)
	}
	if infos, err := s.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Fatalf("store not empty after rejected puts: %v, %v", infos, err)
	}
}

func testConcurrent(t *testing.T, s objectstore.Store) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			key, b := fmt.Sprintf("conc/%d/obj", i), data(256<<10+i, uint64(i))
			if err := s.Put(context.Background(), key, bytesReader(b), int64(len(b))); err != nil {
				errs <- err
				return
			}
			rc, err := s.Get(context.Background(), key, objectstore.Range{})
			if err == nil {
				got, rerr := io.ReadAll(rc)
				rc.Close()
				if err = rerr; err == nil && string(got) != string(b) {
					err = fmt.Errorf("%s: content differs", key)
				}
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
