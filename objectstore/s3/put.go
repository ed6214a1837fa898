package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/objectstore/internal/base"
)

// maxParts is S3's limit on the parts of one multipart upload.
const maxParts = 10000

// Put reads the first part; an object that fits goes up in one PUT, a bigger one as a
// multipart upload. Nothing is visible under key until the upload completes.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := base.ValidateKey(key); err != nil {
		return err
	}
	if size < -1 {
		return fmt.Errorf("s3 put %q: size %d: %w", key, size, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("s3 put %q: %w", key, err)
	}
	r = base.ContextReader(ctx, r)
	buf := s.getBuf()
	n, eof, err := fill(r, *buf)
	if err != nil {
		s.bufs.Put(buf)
		return fmt.Errorf("s3 put %q: read: %w", key, err)
	}
	if eof {
		defer s.bufs.Put(buf)
		return s.putSingle(ctx, key, (*buf)[:n], size)
	}
	return s.putMultipart(ctx, key, r, size, buf)
}

// fill reads into buf until it is full or r ends. Unlike io.ReadFull it tells the end of r
// (eof) apart from a reader that fails with io.ErrUnexpectedEOF.
func fill(r io.Reader, buf []byte) (n int, eof bool, err error) {
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

func (s *Store) getBuf() *[]byte { return s.bufs.Get().(*[]byte) }

func checkSize(got, declared int64) error {
	if declared >= 0 && got != declared {
		return fmt.Errorf("reader yielded %d bytes, declared size is %d: %w", got, declared, errdefs.ErrInvalidArgument)
	}
	return nil
}

// putOptions sets PartSize and NumThreads explicitly, always: left at zero, minio-go sizes
// parts for a 5 TiB object.
func (s *Store) putOptions() minio.PutObjectOptions {
	return minio.PutObjectOptions{
		ContentType:          "application/octet-stream",
		PartSize:             uint64(s.cfg.partSize),
		NumThreads:           uint(s.cfg.concurrency),
		DisableContentSha256: !s.cfg.signPayload,
	}
}

func (s *Store) putSingle(ctx context.Context, key string, data []byte, size int64) error {
	if err := checkSize(int64(len(data)), size); err != nil {
		return fmt.Errorf("s3 put %q: %w", key, err)
	}
	err := s.cfg.retry.do(ctx, "put", func(ctx context.Context) error {
		_, err := s.core.PutObject(ctx, s.bucket, s.objectKey(key), bytes.NewReader(data), int64(len(data)), "", "", s.putOptions())
		return err
	})
	return mapErr("put", key, err)
}

func (s *Store) putMultipart(ctx context.Context, key string, r io.Reader, size int64, first *[]byte) error {
	var id string
	err := s.cfg.retry.do(ctx, "create multipart upload", func(ctx context.Context) (err error) {
		id, err = s.core.NewMultipartUpload(ctx, s.bucket, s.objectKey(key), s.putOptions())
		return err
	})
	if err != nil {
		s.bufs.Put(first)
		return mapErr("put", key, err)
	}
	u := newUpload(ctx, s, key, id)
	total, err := u.run(r, first, size)
	if err == nil {
		err = checkSize(total, size)
	}
	if err == nil {
		err = u.complete(total)
	}
	if err != nil {
		u.abort()
		return mapErr("put", key, err)
	}
	return nil
}

// upload is one multipart upload in progress: the reader loop fills part buffers and hands
// each to a goroutine; at most concurrency parts are in flight.
type upload struct {
	s      *Store
	key    string
	id     string
	parent context.Context
	ctx    context.Context
	cancel context.CancelCauseFunc
	sem    chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	parts  []minio.CompletePart
	err    error
}

func newUpload(ctx context.Context, s *Store, key, id string) *upload {
	uctx, cancel := context.WithCancelCause(ctx)
	return &upload{s: s, key: key, id: id, parent: ctx, ctx: uctx, cancel: cancel,
		sem: make(chan struct{}, s.cfg.concurrency)}
}

// run uploads first and the rest of r part by part and returns the bytes read.
func (u *upload) run(r io.Reader, buf *[]byte, size int64) (int64, error) {
	defer u.cancel(nil)
	n, total := len(*buf), int64(0)
	for part := 1; ; part++ {
		total += int64(n)
		if err := u.checkPart(part, total, size); err != nil {
			u.s.bufs.Put(buf)
			return total, u.fail(err)
		}
		u.send(part, buf, n)
		buf = u.s.getBuf()
		var eof bool
		var err error
		n, eof, err = fill(r, *buf)
		switch {
		case err != nil:
			u.s.bufs.Put(buf)
			return total, u.fail(fmt.Errorf("read: %w", err))
		case n == 0 || u.ctx.Err() != nil:
			u.s.bufs.Put(buf)
			return total, u.wait()
		case eof:
			u.send(part+1, buf, n)
			return total + int64(n), u.wait()
		}
	}
}

func (u *upload) checkPart(part int, total, size int64) error {
	if part > maxParts {
		return fmt.Errorf("object exceeds %d parts of %d bytes: %w", maxParts, u.s.cfg.partSize, errdefs.ErrInvalidArgument)
	}
	return checkSize(max(total, size), size) // fails early once total passes a known size
}

// send uploads buf[:n] as part in a goroutine once a slot is free, then recycles buf.
func (u *upload) send(part int, buf *[]byte, n int) {
	select {
	case u.sem <- struct{}{}:
	case <-u.ctx.Done():
		u.s.bufs.Put(buf)
		return
	}
	u.wg.Go(func() {
		defer func() { <-u.sem; u.s.bufs.Put(buf) }()
		if err := u.uploadPart(part, (*buf)[:n]); err != nil {
			u.record(fmt.Errorf("part %d: %w", part, err))
		}
	})
}

func (u *upload) uploadPart(part int, data []byte) error {
	opts := minio.PutObjectPartOptions{DisableContentSha256: !u.s.cfg.signPayload}
	return u.s.cfg.retry.do(u.ctx, "upload part", func(ctx context.Context) error {
		p, err := u.s.core.PutObjectPart(ctx, u.s.bucket, u.s.objectKey(u.key), u.id, part,
			bytes.NewReader(data), int64(len(data)), opts)
		if err == nil {
			u.mu.Lock()
			u.parts = append(u.parts, minio.CompletePart{PartNumber: part, ETag: p.ETag})
			u.mu.Unlock()
		}
		return err
	})
}

// record keeps the first error and stops the other parts.
func (u *upload) record(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.err == nil {
		u.err = err
		u.cancel(err)
	}
}

func (u *upload) fail(err error) error {
	u.record(err)
	u.wait()
	return err
}

// wait waits for the parts in flight and returns the first error. A part that failed
// because the caller's context ended reports that context's error.
func (u *upload) wait() error {
	u.wg.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.parent.Err(); err != nil && (u.err == nil || errors.Is(u.err, context.Canceled)) {
		return err
	}
	return u.err
}

// complete finishes the upload. Completion is not idempotent: when an attempt succeeded but
// its answer was lost, the retry finds no such upload, and the object's size and part count
// tell whether it was ours.
func (u *upload) complete(total int64) error {
	slices.SortFunc(u.parts, func(a, b minio.CompletePart) int { return a.PartNumber - b.PartNumber })
	attempts := 0
	err := u.s.cfg.retry.do(u.parent, "complete multipart upload", func(ctx context.Context) error {
		attempts++
		_, err := u.s.core.CompleteMultipartUpload(ctx, u.s.bucket, u.s.objectKey(u.key), u.id, u.parts, u.s.putOptions())
		return err
	})
	if attempts > 1 && isCode(err, "NoSuchUpload") && u.completedEarlier(total) {
		return nil
	}
	return err
}

func (u *upload) completedEarlier(total int64) bool {
	oi, err := u.s.client.StatObject(u.parent, u.s.bucket, u.s.objectKey(u.key), minio.StatObjectOptions{})
	return err == nil && oi.Size == total && strings.HasSuffix(oi.ETag, fmt.Sprintf("-%d", len(u.parts)))
}

// abort drops the uploaded parts; it runs (and is retried: a server may still be writing a
// part whose request was cancelled) even when the caller's context is cancelled. A failure
// only leaves parts behind (invisible, reclaimable by bucket lifecycle rules).
func (u *upload) abort() {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(u.parent), 10*time.Second)
	defer cancel()
	err := u.s.cfg.retry.do(ctx, "abort multipart upload", func(ctx context.Context) error {
		err := u.s.core.AbortMultipartUpload(ctx, u.s.bucket, u.s.objectKey(u.key), u.id)
		if isCode(err, "NoSuchUpload") {
			return nil
		}
		return err
	})
	if err != nil {
		log.L(ctx).Warn("s3 abort multipart upload failed", "key", u.key, "upload", u.id, "error", err)
	}
}
