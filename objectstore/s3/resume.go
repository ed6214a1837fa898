package s3

import (
	"context"
	"io"

	"github.com/minio/minio-go/v7"

	"github.com/deltabox/deltabox/internal/log"
)

// resumingReader reads a GET response and, when the connection breaks mid-body, continues
// with a ranged GET from the first missing byte, pinned to the object's ETag (If-Match) so a
// replaced object is an error rather than a splice of two versions. Consecutive failures
// without progress are bounded by the store's retry policy.
type resumingReader struct {
	ctx       context.Context
	s         *Store
	key       string
	etag      string
	off       int64 // absolute offset of the next byte
	remaining int64 // bytes still to deliver
	body      io.ReadCloser
	failures  int
	err       error
}

func newResumingReader(ctx context.Context, s *Store, key string, off int64, body io.ReadCloser, info minio.ObjectInfo) io.ReadCloser {
	if info.Size < 0 || info.ETag == "" { // length or version unknown: cannot resume safely
		return body
	}
	return &resumingReader{ctx: ctx, s: s, key: key, etag: info.ETag, off: off, remaining: info.Size, body: body}
}

func (r *resumingReader) Read(p []byte) (int, error) {
	for r.err == nil {
		if r.remaining == 0 {
			return 0, io.EOF
		}
		if r.body == nil {
			if err := r.reopen(); err != nil {
				r.retryOrFail(err)
				continue
			}
		}
		n, err := r.body.Read(p[:min(int64(len(p)), r.remaining)])
		r.off, r.remaining = r.off+int64(n), r.remaining-int64(n)
		if n > 0 {
			r.failures = 0
		}
		if err == io.EOF && r.remaining > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err == nil || err == io.EOF {
			return n, err
		}
		r.body.Close()
		r.body = nil
		if n > 0 && transient(err) {
			return n, nil
		}
		r.retryOrFail(err)
	}
	return 0, r.err
}

// reopen requests the rest of the range.
func (r *resumingReader) reopen() error {
	var opts minio.GetObjectOptions
	if err := opts.SetMatchETag(r.etag); err != nil {
		return err
	}
	if err := opts.SetRange(r.off, r.off+r.remaining-1); err != nil {
		return err
	}
	body, _, _, err := r.s.core.GetObject(r.ctx, r.s.bucket, r.s.objectKey(r.key), opts)
	if err == nil {
		r.body = body
	}
	return err
}

// retryOrFail waits before the next attempt, or makes err final when it is not transient,
// the attempts are used up or the context is done.
func (r *resumingReader) retryOrFail(err error) {
	r.failures++
	if !transient(err) || r.failures >= r.s.cfg.retry.attempts || r.ctx.Err() != nil {
		r.err = mapErr("get", r.key, err)
		return
	}
	wait := r.s.cfg.retry.backoff(r.failures)
	log.L(r.ctx).Debug("s3 download broke, resuming", "key", r.key, "offset", r.off, "attempt", r.failures, "wait", wait, "error", err)
	if !sleep(r.ctx, wait) {
		r.err = mapErr("get", r.key, r.ctx.Err())
	}
}

func (r *resumingReader) Close() error {
	if r.body == nil {
		return nil
	}
	err := r.body.Close()
	r.body = nil
	if r.err == nil {
		r.err = errClosed
	}
	return err
}
