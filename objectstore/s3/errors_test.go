package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"
)

func TestMapErr(t *testing.T) {
	refused := &url.Error{Op: "Put", URL: "http://x", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}
	cases := []struct {
		err       error
		class     error
		transient bool
	}{
		{minio.ErrorResponse{Code: "NoSuchKey", StatusCode: 404}, errdefs.ErrNotFound, false},
		{minio.ErrorResponse{StatusCode: 404}, errdefs.ErrNotFound, false},
		{minio.ErrorResponse{Code: "InvalidRange", StatusCode: 416}, errdefs.ErrInvalidArgument, false},
		{minio.ErrorResponse{Code: "AccessDenied", StatusCode: 403}, errdefs.ErrPermissionDenied, false},
		{minio.ErrorResponse{Code: "SlowDown", StatusCode: 503}, errdefs.ErrUnavailable, true},
		{minio.ErrorResponse{Code: "InternalError", StatusCode: 500}, errdefs.ErrUnavailable, true},
		{fmt.Errorf("wrapped: %w", minio.ErrorResponse{Code: "NoSuchBucket", StatusCode: 404}), errdefs.ErrNotFound, false},
		{refused, errdefs.ErrUnavailable, true},
		{io.ErrUnexpectedEOF, errdefs.ErrUnavailable, true},
	}
	for _, c := range cases {
		err := mapErr("op", "key", c.err)
		if !errors.Is(err, c.class) || !errors.Is(err, c.err) {
			t.Errorf("mapErr(%v) = %v, want it to wrap %v and the original", c.err, err, c.class)
		}
		if got := transient(c.err); got != c.transient {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.transient)
		}
	}
	ctxErr := &url.Error{Op: "Get", URL: "http://x", Err: context.Canceled}
	if err := mapErr("op", "k", ctxErr); !errors.Is(err, context.Canceled) || errors.Is(err, errdefs.ErrUnavailable) || transient(ctxErr) {
		t.Errorf("cancellation mapped to %v", err)
	}
	if mapErr("op", "k", nil) != nil {
		t.Error("mapErr(nil) != nil")
	}
}

func TestRetryBounded(t *testing.T) {
	p := newRetryPolicy(4, time.Millisecond)
	calls := 0
	err := p.do(context.Background(), "op", func(context.Context) error {
		calls++
		return minio.ErrorResponse{Code: "SlowDown", StatusCode: 503}
	})
	if calls != 4 || err == nil {
		t.Fatalf("transient failure: %d calls, %v; want 4 calls and the error", calls, err)
	}
	calls = 0
	_ = p.do(context.Background(), "op", func(context.Context) error {
		calls++
		return minio.ErrorResponse{Code: "NoSuchKey", StatusCode: 404}
	})
	if calls != 1 {
		t.Fatalf("permanent failure retried: %d calls", calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	_ = newRetryPolicy(100, time.Hour).do(ctx, "op", func(context.Context) error {
		calls++
		cancel()
		return io.ErrUnexpectedEOF
	})
	if calls != 1 {
		t.Fatalf("retried after cancellation: %d calls", calls)
	}
}

func TestConfigChecks(t *testing.T) {
	for _, opts := range [][]Option{
		{WithPartSize(MinPartSize - 1)}, {WithPartSize(MaxPartSize + 1)}, {WithConcurrency(0)},
		{WithRetry(0, time.Second)}, {WithPrefix("/abs")},
	} {
		if _, err := New(context.Background(), "127.0.0.1:9", "b", opts...); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New with bad option: %v, want ErrInvalidArgument", err)
		}
	}
	for _, ep := range []string{"", "http://127.0.0.1:9"} {
		if _, err := New(context.Background(), ep, "b"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New(endpoint %q): %v, want ErrInvalidArgument", ep, err)
		}
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "envkey")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	cfg, err := newConfig([]Option{WithPrefix("p")})
	if err != nil || cfg.accessKey != "envkey" || cfg.secretKey != "envsecret" || cfg.prefix != "p/" {
		t.Fatalf("config from env = %+v, %v", cfg, err)
	}
	cfg, _ = newConfig([]Option{WithCredentials("k", "s")})
	if cfg.accessKey != "k" || cfg.secretKey != "s" {
		t.Fatalf("explicit credentials not preferred: %+v", cfg)
	}
}
