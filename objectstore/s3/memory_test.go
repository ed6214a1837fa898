package s3_test

import (
	"context"
	"io"
	"runtime"
	"testing"

	"github.com/deltabox/deltabox/objectstore/s3"
	"github.com/deltabox/deltabox/objectstore/s3test"
)

// TestPutUnknownSizeMemory guards the minio-go pitfall: an upload of unknown size must not
// allocate part buffers sized for a 5 TiB object (~537 MiB each). With 16 MiB parts and 4 in
// flight a Put needs at most 5 part buffers.
func TestPutUnknownSizeMemory(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "mem", s3.WithPartSize(s3.DefaultPartSize), s3.WithConcurrency(s3.DefaultConcurrency))
	const size = 96 << 20
	src := io.LimitReader(zeroReader{}, size)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := s.Put(context.Background(), "big", src, -1); err != nil {
		t.Fatalf("Put: %v", err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	limit := uint64((s3.DefaultConcurrency+1)*s3.DefaultPartSize + 32<<20)
	t.Logf("Put of %d MiB of unknown size allocated %d MiB", size>>20, alloc>>20)
	if alloc > limit {
		t.Fatalf("Put allocated %d MiB, want <= %d MiB", alloc>>20, limit>>20)
	}
	info, err := s.Stat(context.Background(), "big")
	if err != nil || info.Size != size {
		t.Fatalf("Stat = %+v, %v; want size %d", info, err, size)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
