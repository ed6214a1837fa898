package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"

	"github.com/deltabox/deltabox/objectstore/internal/base"
)

// Get opens the object, or the part rng selects, with a ranged GET; a download that breaks
// midway resumes where it stopped (see resumingReader).
func (s *Store) Get(ctx context.Context, key string, rng base.Range) (io.ReadCloser, error) {
	if err := base.ValidateKey(key); err != nil {
		return nil, err
	}
	opts, err := getOptions(rng)
	if err != nil {
		return nil, fmt.Errorf("s3 get %q: %w", key, err)
	}
	var body io.ReadCloser
	var info minio.ObjectInfo
	err = s.cfg.retry.do(ctx, "get", func(ctx context.Context) (err error) {
		body, info, _, err = s.core.GetObject(ctx, s.bucket, s.objectKey(key), opts)
		return err
	})
	if err != nil && rng.Offset == 0 && errors.Is(classify(err), errdefs.ErrInvalidArgument) {
		// S3 refuses any range on an empty object; the contract allows offset 0.
		return s.Get(ctx, key, base.Range{})
	}
	if err != nil {
		return nil, mapErr("get", key, err)
	}
	rc := newResumingReader(ctx, s, key, rng.Offset, body, info)
	return base.ReadCloser{Reader: base.ContextReader(ctx, rc), Closer: rc}, nil
}

func getOptions(rng base.Range) (minio.GetObjectOptions, error) {
	var opts minio.GetObjectOptions
	if err := rng.Check(1<<62 + 1); err != nil { // size unknown here: only the sign is checked
		return opts, err
	}
	switch {
	case rng.Whole():
		return opts, nil
	case rng.Length > 0:
		return opts, opts.SetRange(rng.Offset, rng.Offset+rng.Length-1)
	default:
		return opts, opts.SetRange(rng.Offset, 0)
	}
}

// Stat returns the object's size and modification time (a HEAD request).
func (s *Store) Stat(ctx context.Context, key string) (base.Info, error) {
	if err := base.ValidateKey(key); err != nil {
		return base.Info{}, err
	}
	var oi minio.ObjectInfo
	err := s.cfg.retry.do(ctx, "stat", func(ctx context.Context) (err error) {
		oi, err = s.client.StatObject(ctx, s.bucket, s.objectKey(key), minio.StatObjectOptions{})
		return err
	})
	if err != nil {
		return base.Info{}, mapErr("stat", key, err)
	}
	return base.Info{Key: key, Size: oi.Size, ModTime: oi.LastModified}, nil
}

// List lists the objects under prefix (recursively), sorted by key.
func (s *Store) List(ctx context.Context, prefix string) ([]base.Info, error) {
	if err := base.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	var out []base.Info
	err := s.cfg.retry.do(ctx, "list", func(ctx context.Context) (err error) {
		out, err = s.listOnce(ctx, prefix)
		return err
	})
	if err != nil {
		return nil, mapErr("list", prefix, err)
	}
	slices.SortFunc(out, func(a, b base.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *Store) listOnce(ctx context.Context, prefix string) ([]base.Info, error) {
	var out []base.Info
	opts := minio.ListObjectsOptions{Prefix: s.objectKey(prefix), Recursive: true}
	for oi := range s.client.ListObjectsIter(ctx, s.bucket, opts) {
		if oi.Err != nil {
			return nil, oi.Err
		}
		key := strings.TrimPrefix(oi.Key, s.cfg.prefix)
		if base.ValidateKey(key) != nil { // directory markers ("a/") and foreign names
			continue
		}
		out = append(out, base.Info{Key: key, Size: oi.Size, ModTime: oi.LastModified})
	}
	return out, ctx.Err()
}

// Delete removes the object; S3 deletes are idempotent, so a HEAD first tells a missing
// object apart.
func (s *Store) Delete(ctx context.Context, key string) error {
	if _, err := s.Stat(ctx, key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	err := s.cfg.retry.do(ctx, "delete", func(ctx context.Context) error {
		return s.client.RemoveObject(ctx, s.bucket, s.objectKey(key), minio.RemoveObjectOptions{})
	})
	return mapErr("delete", key, err)
}
