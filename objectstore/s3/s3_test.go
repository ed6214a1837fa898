package s3_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/objectstore/s3"
	"github.com/deltabox/deltabox/objectstore/s3test"
	"github.com/deltabox/deltabox/objectstore/storetest"
)

// newStore returns a store on srv with the smallest part size S3 allows, so the suite's
// multi-MiB objects go through multipart uploads.
func newStore(t testing.TB, srv *s3test.Server, prefix string, opts ...s3.Option) *s3.Store {
	opts = append([]s3.Option{
		s3.WithCredentials(srv.AccessKey, srv.SecretKey),
		s3.WithTLS(false),
		s3.WithPrefix(prefix),
		s3.WithPartSize(s3.MinPartSize),
	}, opts...)
	s, err := s3.New(context.Background(), srv.Endpoint, srv.Bucket, opts...)
	if err != nil {
		t.Fatalf("s3.New: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	srv := s3test.Start(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) objectstore.Store {
		return newStore(t, srv, fmt.Sprintf("case-%d", n.Add(1)))
	})
}

// TestConformanceSinglePart runs the suite with parts bigger than every object, so each
// Put is one PUT request.
func TestConformanceSinglePart(t *testing.T) {
	srv := s3test.Start(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) objectstore.Store {
		return newStore(t, srv, fmt.Sprintf("case-%d", n.Add(1)), s3.WithPartSize(64<<20), s3.WithConcurrency(1))
	})
}

func TestConformanceViaOpen(t *testing.T) {
	srv := s3test.Start(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) objectstore.Store {
		s, err := objectstore.Open(context.Background(), srv.URI(fmt.Sprintf("open-%d", n.Add(1))),
			objectstore.WithCredentials(srv.AccessKey, srv.SecretKey), objectstore.WithPartSize(s3.MinPartSize))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

func TestCreateBucket(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	s, err := s3.New(ctx, srv.Endpoint, "fresh-bucket", s3.WithCredentials(srv.AccessKey, srv.SecretKey),
		s3.WithTLS(false), s3.WithCreateBucket(true))
	if err != nil {
		t.Fatalf("New with bucket creation: %v", err)
	}
	if ok, err := srv.Client().BucketExists(ctx, "fresh-bucket"); err != nil || !ok {
		t.Fatalf("bucket not created: %v, %v", ok, err)
	}
	if _, err := s3.New(ctx, srv.Endpoint, "fresh-bucket", s3.WithCredentials(srv.AccessKey, srv.SecretKey),
		s3.WithTLS(false), s3.WithCreateBucket(true)); err != nil {
		t.Fatalf("New with an existing bucket: %v", err)
	}
	if err := s.Put(ctx, "k", strings.NewReader(""), 0); err != nil {
		t.Fatalf("Put into created bucket: %v", err)
	}
}

func TestWrongCredentials(t *testing.T) {
	srv := s3test.Start(t)
	s, err := s3.New(context.Background(), srv.Endpoint, srv.Bucket, s3.WithCredentials(srv.AccessKey, "wrong"),
		s3.WithTLS(false), s3.WithRetry(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Stat(context.Background(), "k")
	if err == nil {
		t.Fatal("Stat with a wrong secret succeeded")
	}
	t.Logf("error with wrong secret: %v", err)
}

// TestOpenWithEnvCredentials opens the store from a URI with the credentials in the
// environment, as the daemon does.
func TestOpenWithEnvCredentials(t *testing.T) {
	srv := s3test.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	st, err := objectstore.Open(context.Background(), srv.URI("env"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := st.Put(context.Background(), "k", strings.NewReader("v"), 1); err != nil {
		t.Fatalf("Put with env credentials: %v", err)
	}
}
