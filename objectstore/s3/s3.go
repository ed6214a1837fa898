// Package s3 is the S3-compatible objectstore backend, built on minio-go. Objects live in one
// bucket under an optional key prefix. Uploads stream in parts of a fixed, configurable size
// with a bounded number of parts in flight, so memory stays at about (concurrency+1) x part
// size per Put whatever the object size; transient failures are retried a bounded number of
// times with exponential backoff.
//
// It owns the translation of S3 errors into errdefs classes (errors.As on
// minio.ErrorResponse happens here and nowhere else). It must not import the objectstore
// package (objectstore imports it) and must not read configuration files.
package s3

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

const (
	// DefaultPartSize is the size of each uploaded part.
	DefaultPartSize = 16 << 20
	// MinPartSize is S3's smallest allowed part (all parts but the last).
	MinPartSize = 5 << 20
	// MaxPartSize is S3's largest allowed part.
	MaxPartSize = 5 << 30
	// DefaultConcurrency is the number of parts uploaded at the same time.
	DefaultConcurrency = 4
	// DefaultRegion is used when none is configured (no bucket-location lookups).
	DefaultRegion = "us-east-1"
)

type config struct {
	prefix       string
	accessKey    string
	secretKey    string
	sessionToken string
	secure       bool
	region       string
	createBucket bool
	signPayload  bool
	partSize     int64
	concurrency  int
	retry        retryPolicy
	transport    http.RoundTripper
}

// Option configures a Store.
type Option func(*config)

// WithPrefix stores every key under prefix inside the bucket ("" by default). A "/" is
// appended when missing.
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithCredentials sets the access and secret key. Without it, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN from the environment are used; with neither,
// requests are anonymous.
func WithCredentials(accessKey, secretKey string) Option {
	return func(c *config) { c.accessKey, c.secretKey = accessKey, secretKey }
}

// WithTLS turns HTTPS on or off (default on).
func WithTLS(enabled bool) Option { return func(c *config) { c.secure = enabled } }

// WithRegion sets the region used for signing (default DefaultRegion).
func WithRegion(region string) Option { return func(c *config) { c.region = region } }

// WithCreateBucket makes New create the bucket when it does not exist.
func WithCreateBucket(create bool) Option { return func(c *config) { c.createBucket = create } }

// WithPartSize sets the upload part size, between MinPartSize and MaxPartSize (default
// DefaultPartSize). Objects up to one part go up in a single PUT.
func WithPartSize(n int64) Option { return func(c *config) { c.partSize = n } }

// WithConcurrency sets how many parts of one Put are uploaded at once (default
// DefaultConcurrency).
func WithConcurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WithRetry sets how many times a request is attempted in all (>= 1; default 5) and the first
// backoff (default 100ms), which doubles up to 20x that per attempt.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *config) { c.retry = newRetryPolicy(attempts, backoff) }
}

// WithPayloadSigning signs upload bodies with SHA-256 (the streaming V4 signature) when TLS
// is off. It protects against tampering in transit at a throughput cost; off by default,
// since DeltaBox verifies every blob against its digest on read.
func WithPayloadSigning(enabled bool) Option { return func(c *config) { c.signPayload = enabled } }

// WithTransport sets the HTTP transport (default: minio-go's).
func WithTransport(rt http.RoundTripper) Option { return func(c *config) { c.transport = rt } }

// Store is an objectstore backend on an S3-compatible bucket. It is safe for concurrent use.
type Store struct {
	client *minio.Client
	core   minio.Core
	bucket string
	cfg    config
	bufs   sync.Pool // *[]byte of cfg.partSize
}

// New returns a Store for bucket at endpoint (host:port, no scheme). It contacts the server
// only when WithCreateBucket is set.
func New(ctx context.Context, endpoint, bucket string, opts ...Option) (*Store, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if endpoint == "" || strings.Contains(endpoint, "://") || bucket == "" {
		return nil, fmt.Errorf("s3 store: endpoint %q must be host:port and bucket %q non-empty: %w", endpoint, bucket, errdefs.ErrInvalidArgument)
	}
	client, err := minio.New(endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.accessKey, cfg.secretKey, cfg.sessionToken),
		Secure:       cfg.secure,
		Region:       cfg.region,
		BucketLookup: minio.BucketLookupPath,
		Transport:    cfg.transport,
		MaxRetries:   1, // retries are ours: bounded, logged, context-aware
	})
	if err != nil {
		return nil, fmt.Errorf("s3 store %s: %w: %w", endpoint, errdefs.ErrInvalidArgument, err)
	}
	s := &Store{client: client, core: minio.Core{Client: client}, bucket: bucket, cfg: cfg}
	s.bufs.New = func() any { b := make([]byte, cfg.partSize); return &b }
	if cfg.createBucket {
		if err := s.ensureBucket(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func newConfig(opts []Option) (config, error) {
	cfg := config{
		secure:      true,
		region:      DefaultRegion,
		partSize:    DefaultPartSize,
		concurrency: DefaultConcurrency,
		retry:       newRetryPolicy(5, 100*time.Millisecond),
		accessKey:   os.Getenv("AWS_ACCESS_KEY_ID"),
		secretKey:   os.Getenv("AWS_SECRET_ACCESS_KEY"),
	}
	if cfg.accessKey != "" {
		cfg.sessionToken = os.Getenv("AWS_SESSION_TOKEN")
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.prefix != "" && !strings.HasSuffix(cfg.prefix, "/") {
		cfg.prefix += "/"
	}
	return cfg, cfg.check()
}

func (c config) check() error {
	switch {
	case c.partSize < MinPartSize || c.partSize > MaxPartSize:
		return fmt.Errorf("s3 part size %d outside [%d, %d]: %w", c.partSize, MinPartSize, MaxPartSize, errdefs.ErrInvalidArgument)
	case c.concurrency < 1:
		return fmt.Errorf("s3 concurrency %d < 1: %w", c.concurrency, errdefs.ErrInvalidArgument)
	case c.retry.attempts < 1:
		return fmt.Errorf("s3 retry attempts %d < 1: %w", c.retry.attempts, errdefs.ErrInvalidArgument)
	case strings.HasPrefix(c.prefix, "/") || strings.Contains(c.prefix, "//"):
		return fmt.Errorf("s3 key prefix %q has empty segments: %w", c.prefix, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ensureBucket creates the bucket unless it exists.
func (s *Store) ensureBucket(ctx context.Context) error {
	var exists bool
	err := s.cfg.retry.do(ctx, "bucket exists", func(ctx context.Context) (err error) {
		exists, err = s.client.BucketExists(ctx, s.bucket)
		return err
	})
	if err != nil || exists {
		return mapErr("check bucket", s.bucket, err)
	}
	err = s.cfg.retry.do(ctx, "make bucket", func(ctx context.Context) error {
		return s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: s.cfg.region})
	})
	if err != nil && !isCode(err, "BucketAlreadyOwnedByYou", "BucketAlreadyExists") {
		return mapErr("create bucket", s.bucket, err)
	}
	return nil
}

// Bucket returns the bucket name.
func (s *Store) Bucket() string { return s.bucket }

// objectKey maps a store key to the key inside the bucket.
func (s *Store) objectKey(key string) string { return s.cfg.prefix + key }
