package storetest

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/deltabox/deltabox/objectstore"
)

func testContextCancel(t *testing.T, s objectstore.Store) {
	put(t, s, "ctx/obj", data(8<<20, 6), 8<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	wantErr(t, "Put with cancelled context", s.Put(ctx, "ctx/new", bytesReader([]byte("x")), 1), context.Canceled)
	_, err := s.Get(ctx, "ctx/obj", objectstore.Range{})
	wantErr(t, "Get with cancelled context", err, context.Canceled)
	_, err = s.Stat(ctx, "ctx/obj")
	wantErr(t, "Stat with cancelled context", err, context.Canceled)
	_, err = s.List(ctx, "")
	wantErr(t, "List with cancelled context", err, context.Canceled)
	wantErr(t, "Delete with cancelled context", s.Delete(ctx, "ctx/obj"), context.Canceled)
	requireAbsent(t, s, "ctx/new")
	testCancelMidPut(t, s)
	testCancelMidGet(t, s)
}

// cancelAfter is a reader that cancels a context once it has yielded n bytes.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	if c.n <= 0 {
		c.cancel()
	}
	m, err := c.r.Read(p[:min(len(p), max(c.n, 1))])
	c.n -= m
	return m, err
}

func testCancelMidPut(t *testing.T, s objectstore.Store) {
	for _, n := range []int{1000, 7 << 20} {
		ctx, cancel := context.WithCancel(context.Background())
		r := &cancelAfter{r: bytesReader(data(12<<20, 7)), n: n, cancel: cancel}
		err := s.Put(ctx, "ctx/mid", r, 12<<20)
		cancel()
		wantErr(t, "Put cancelled mid-stream", err, context.Canceled)
		requireAbsent(t, s, "ctx/mid")
	}
}

func testCancelMidGet(t *testing.T, s objectstore.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc, err := s.Get(ctx, "ctx/obj", objectstore.Range{})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1000)); err != nil {
		t.Fatalf("read: %v", err)
	}
	cancel()
	n, err := io.Copy(io.Discard, rc)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel: %d more bytes, error %v; want context.Canceled", n, err)
	}
}
