package storetest

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/deltabox/deltabox/objectstore"
)

// BenchmarkPut measures Put of size-byte objects of unknown size (the L3 packaging case:
// the uploader streams without knowing the total). b.SetBytes makes the result show MB/s.
func BenchmarkPut(b *testing.B, s objectstore.Store, size int) {
	payload := data(size, 99)
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := s.Put(ctx, "bench/put", streamOnly{bytes.NewReader(payload)}, -1); err != nil {
			b.Fatalf("Put: %v", err)
		}
	}
}

// BenchmarkGet measures reading a size-byte object to the end.
func BenchmarkGet(b *testing.B, s objectstore.Store, size int) {
	ctx := context.Background()
	if err := s.Put(ctx, "bench/get", bytes.NewReader(data(size, 98)), int64(size)); err != nil {
		b.Fatalf("Put: %v", err)
	}
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rc, err := s.Get(ctx, "bench/get", objectstore.Range{})
		if err != nil {
			b.Fatalf("Get: %v", err)
		}
		n, err := io.CopyBuffer(io.Discard, rc, buf)
		rc.Close()
		if err != nil || n != int64(size) {
			b.Fatalf("Get: read %d bytes, %v", n, err)
		}
	}
}
