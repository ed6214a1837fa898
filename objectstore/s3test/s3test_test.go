package s3test_test

import (
	"bytes"
	"context"
	"net/url"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/deltabox/deltabox/objectstore/s3test"
)

func TestStartStopRestart(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	c := srv.Client()
	if _, err := c.PutObject(ctx, srv.Bucket, "k", bytes.NewReader([]byte("v")), 1, minio.PutObjectOptions{}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	srv.Stop()
	if srv.Running() {
		t.Fatal("Running after Stop")
	}
	if _, err := c.StatObject(ctx, srv.Bucket, "k", minio.StatObjectOptions{}); err == nil {
		t.Fatal("StatObject succeeded on a stopped server")
	}
	srv.Stop() // idempotent
	srv.Restart()
	if !srv.Running() {
		t.Fatal("not Running after Restart")
	}
	if info, err := c.StatObject(ctx, srv.Bucket, "k", minio.StatObjectOptions{}); err != nil || info.Size != 1 {
		t.Fatalf("object after Restart: %+v, %v", info, err)
	}
	u, err := url.Parse(srv.URI("p/q"))
	if err != nil || u.Scheme != "s3" || u.Host != srv.Bucket || u.Path != "/p/q" || u.Query().Get("endpoint") != srv.Endpoint {
		t.Fatalf("URI = %q, %v", srv.URI("p/q"), err)
	}
	if env := srv.Env(); len(env) != 2 || env[1] != "AWS_SECRET_ACCESS_KEY="+srv.SecretKey {
		t.Fatalf("Env = %q", env)
	}
}
