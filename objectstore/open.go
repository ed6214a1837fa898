package objectstore

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore/local"
	"github.com/deltabox/deltabox/objectstore/s3"
)

// openConfig collects the Options of Open; zero values mean "the backend's default".
type openConfig struct {
	accessKey, secretKey string
	createBucket         *bool
	partSize             int64
	concurrency          int
	retryAttempts        int
	retryBackoff         time.Duration
	noSync               bool
}

// Option tunes the Store that Open builds. Options that do not apply to the URI's backend
// are ignored. Options override the URI's query parameters.
type Option func(*openConfig)

// WithCredentials sets the S3 access and secret key (default: AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY from the environment).
func WithCredentials(accessKey, secretKey string) Option {
	return func(c *openConfig) { c.accessKey, c.secretKey = accessKey, secretKey }
}

// WithCreateBucket makes Open create a missing S3 bucket.
func WithCreateBucket(create bool) Option {
	return func(c *openConfig) { c.createBucket = &create }
}

// WithPartSize sets the S3 upload part size (default s3.DefaultPartSize, 16 MiB).
func WithPartSize(n int64) Option { return func(c *openConfig) { c.partSize = n } }

// WithConcurrency sets how many parts of one S3 upload are in flight (default 4).
func WithConcurrency(n int) Option { return func(c *openConfig) { c.concurrency = n } }

// WithRetry bounds S3 retries: attempts in all and the first backoff.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *openConfig) { c.retryAttempts, c.retryBackoff = attempts, backoff }
}

// WithoutSync turns off fsync in the local backend (throwaway stores and tests only).
func WithoutSync() Option { return func(c *openConfig) { c.noSync = true } }

// Open builds a Store from a URI:
//
//	file:///var/lib/deltabox/objects   local backend rooted at that directory
//	/var/lib/deltabox/objects          the same, as a bare absolute path
//	s3://bucket/prefix?endpoint=127.0.0.1:9000&tls=false&region=us-east-1&create_bucket=true
//
// For s3, endpoint defaults to s3.amazonaws.com and tls to true. Malformed URIs are
// errdefs.ErrInvalidArgument.
func Open(ctx context.Context, uri string, opts ...Option) (Store, error) {
	var cfg openConfig
	for _, o := range opts {
		o(&cfg)
	}
	if strings.HasPrefix(uri, "/") {
		return openLocal(uri, cfg)
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("object store URI %q: %w: %w", uri, errdefs.ErrInvalidArgument, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("object store URI %q: file URIs take no host (use file:///path): %w", uri, errdefs.ErrInvalidArgument)
		}
		return openLocal(u.Path, cfg)
	case "s3":
		return openS3(ctx, u, cfg)
	}
	return nil, fmt.Errorf("object store URI %q: scheme must be file or s3: %w", uri, errdefs.ErrInvalidArgument)
}

func openLocal(path string, cfg openConfig) (Store, error) {
	if path == "" || !filepath.IsAbs(path) {
		return nil, fmt.Errorf("object store path %q must be absolute: %w", path, errdefs.ErrInvalidArgument)
	}
	st, err := local.New(path, local.WithSync(!cfg.noSync))
	if err != nil {
		return nil, err
	}
	return st, nil
}

func openS3(ctx context.Context, u *url.URL, cfg openConfig) (Store, error) {
	q := u.Query()
	opts, err := s3QueryOptions(q)
	if err != nil {
		return nil, fmt.Errorf("object store URI %q: %w", u.Redacted(), err)
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		opts = append(opts, s3.WithPrefix(p))
	}
	opts = append(opts, cfg.s3Options()...)
	endpoint := q.Get("endpoint")
	if endpoint == "" {
		endpoint = "s3.amazonaws.com"
	}
	st, err := s3.New(ctx, endpoint, u.Host, opts...)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// s3QueryOptions turns the URI's query parameters into options.
func s3QueryOptions(q url.Values) ([]s3.Option, error) {
	var opts []s3.Option
	for name := range q {
		switch name {
		case "endpoint":
		case "region":
			opts = append(opts, s3.WithRegion(q.Get(name)))
		case "tls", "create_bucket":
			b, err := strconv.ParseBool(q.Get(name))
			if err != nil {
				return nil, fmt.Errorf("parameter %s=%q is not a boolean: %w", name, q.Get(name), errdefs.ErrInvalidArgument)
			}
			opts = append(opts, boolOption(name, b))
		default:
			return nil, fmt.Errorf("unknown parameter %q (want endpoint, tls, region, create_bucket): %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return opts, nil
}

func boolOption(name string, b bool) s3.Option {
	if name == "tls" {
		return s3.WithTLS(b)
	}
	return s3.WithCreateBucket(b)
}

func (c openConfig) s3Options() []s3.Option {
	var opts []s3.Option
	if c.accessKey != "" || c.secretKey != "" {
		opts = append(opts, s3.WithCredentials(c.accessKey, c.secretKey))
	}
	if c.createBucket != nil {
		opts = append(opts, s3.WithCreateBucket(*c.createBucket))
	}
	if c.partSize != 0 {
		opts = append(opts, s3.WithPartSize(c.partSize))
	}
	if c.concurrency != 0 {
		opts = append(opts, s3.WithConcurrency(c.concurrency))
	}
	if c.retryAttempts != 0 {
		opts = append(opts, s3.WithRetry(c.retryAttempts, c.retryBackoff))
	}
	return opts
}
