package s3_test

import (
	"fmt"
	"testing"

	"github.com/deltabox/deltabox/objectstore/s3"
	"github.com/deltabox/deltabox/objectstore/s3test"
	"github.com/deltabox/deltabox/objectstore/storetest"
)

const benchSize = 64 << 20

// The defaults (16 MiB parts, 4 in flight, unsigned payload) against a local versitygw.
func BenchmarkPut(b *testing.B) {
	srv := s3test.Start(b)
	storetest.BenchmarkPut(b, benchStore(b, srv), benchSize)
}

func BenchmarkGet(b *testing.B) {
	srv := s3test.Start(b)
	storetest.BenchmarkGet(b, benchStore(b, srv), benchSize)
}

// BenchmarkPutSigned is BenchmarkPut with SHA-256 payload signing (the streaming V4
// signature minio-go uses over plain HTTP by default).
func BenchmarkPutSigned(b *testing.B) {
	srv := s3test.Start(b)
	storetest.BenchmarkPut(b, benchStore(b, srv, s3.WithPayloadSigning(true)), benchSize)
}

func benchStore(b *testing.B, srv *s3test.Server, opts ...s3.Option) *s3.Store {
	opts = append([]s3.Option{s3.WithPartSize(s3.DefaultPartSize)}, opts...)
	return newStore(b, srv, "bench", opts...)
}

// BenchmarkPutTuning sweeps part size and concurrency around the defaults.
func BenchmarkPutTuning(b *testing.B) {
	srv := s3test.Start(b)
	for _, part := range []int64{8 << 20, 16 << 20, 32 << 20} {
		for _, conc := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("part=%dMiB/conc=%d", part>>20, conc), func(b *testing.B) {
				s := newStore(b, srv, "tuning", s3.WithPartSize(part), s3.WithConcurrency(conc))
				storetest.BenchmarkPut(b, s, benchSize)
			})
		}
	}
}
