// Package base holds the types and checks that the objectstore package and its backends
// share: object metadata, byte ranges, key validation and a context-aware reader. It exists so
// that backends (objectstore/local, objectstore/s3) need not import objectstore, which imports
// them for Open. It must not depend on any backend or do any I/O of its own.
package base

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// MaxKeyLen is the longest key accepted, in bytes (S3's limit).
const MaxKeyLen = 1024

// Info describes one stored object.
type Info struct {
	Key     string    // the object's key, "/"-separated
	Size    int64     // size in bytes
	ModTime time.Time // time of the last successful Put
}

// Range selects the bytes [Offset, Offset+Length) of an object. A Length <= 0 means "to the
// end"; a Length past the end is cut at the end. The zero Range is the whole object.
type Range struct {
	Offset int64
	Length int64
}

// Whole reports whether r selects the whole object.
func (r Range) Whole() bool { return r.Offset == 0 && r.Length <= 0 }

// Check returns an ErrInvalidArgument error when r cannot be applied to an object of size.
// Offset must lie inside the object; only an empty object may be read at offset 0.
func (r Range) Check(size int64) error {
	if r.Offset < 0 {
		return fmt.Errorf("range offset %d is negative: %w", r.Offset, errdefs.ErrInvalidArgument)
	}
	if r.Offset > 0 && r.Offset >= size {
		return fmt.Errorf("range offset %d is past the end of a %d byte object: %w", r.Offset, size, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ValidateKey checks that key is a relative "/"-separated path that cannot escape a root:
// not empty, no leading or trailing "/", no empty, "." or ".." segments, no NUL, valid UTF-8,
// at most MaxKeyLen bytes. It returns an ErrInvalidArgument error naming the key.
func ValidateKey(key string) error {
	if err := checkChars(key); err != nil {
		return err
	}
	if key == "" {
		return invalidKey(key, "empty key")
	}
	for _, seg := range strings.Split(key, "/") {
		if err := checkSegment(key, seg); err != nil {
			return err
		}
	}
	return nil
}

// ValidatePrefix checks a List prefix: empty, or a key whose last segment may be partial or
// empty (a trailing "/").
func ValidatePrefix(prefix string) error {
	if err := checkChars(prefix); err != nil {
		return err
	}
	segs := strings.Split(prefix, "/")
	for _, seg := range segs[:len(segs)-1] {
		if err := checkSegment(prefix, seg); err != nil {
			return err
		}
	}
	return nil
}

func checkChars(s string) error {
	switch {
	case len(s) > MaxKeyLen:
		return invalidKey(s[:32]+"...", fmt.Sprintf("longer than %d bytes", MaxKeyLen))
	case !utf8.ValidString(s):
		return invalidKey(s, "not valid UTF-8")
	case strings.ContainsRune(s, 0):
		return invalidKey(s, "contains NUL")
	}
	return nil
}

func checkSegment(key, seg string) error {
	switch seg {
	case "":
		return invalidKey(key, "empty path segment (leading, trailing or double \"/\")")
	case ".", "..":
		return invalidKey(key, fmt.Sprintf("%q path segment", seg))
	}
	return nil
}

func invalidKey(key, why string) error {
	return fmt.Errorf("invalid object key %q: %s: %w", key, why, errdefs.ErrInvalidArgument)
}

// ContextReader returns a reader that fails with ctx's error once ctx is done, checked before
// every Read, so a long copy stops soon after cancellation.
func ContextReader(ctx context.Context, r io.Reader) io.Reader {
	return &ctxReader{ctx: ctx, r: r}
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ReadCloser joins a Reader with the Closer that releases it.
type ReadCloser struct {
	io.Reader
	io.Closer
}
