// Package objectstore is DeltaBox's blob storage for L3 snapshots: a small Store interface
// (streaming put, ranged get, stat, list by prefix, delete), content-addressed helpers on top
// of it (CAS: sha256-keyed blobs uploaded once and verified on read) and Open, which builds a
// Store from a URI (file:///path or s3://bucket/prefix?endpoint=...). The backends live in
// objectstore/local (the embedded default) and objectstore/s3 (S3-compatible via minio-go);
// objectstore/storetest is the conformance suite both pass.
//
// This package must not know about snapshots, sandboxes or packaging formats: keys and bytes
// only. It must not read configuration files; the daemon turns its config into a URI and
// Options.
package objectstore

import (
	"context"
	"io"

	"github.com/deltabox/deltabox/objectstore/internal/base"
)

// Info describes one stored object: key, size and modification time.
type Info = base.Info

// Range selects part of an object for Get; the zero Range is the whole object.
type Range = base.Range

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = base.MaxKeyLen

// Store is blob storage addressed by "/"-separated keys. Every backend passes
// objectstore/storetest, which pins the contract below.
//
// Keys must pass ValidateKey; otherwise methods fail with errdefs.ErrInvalidArgument. A
// missing object is errdefs.ErrNotFound; a backend that cannot be reached is
// errdefs.ErrUnavailable (after the backend's bounded retries). A cancelled context stops
// every call and its error wraps ctx.Err().
type Store interface {
	// Put stores the bytes of r under key, replacing any previous object. size is the number
	// of bytes r yields, or -1 when unknown; a reader that yields another number of bytes is
	// an ErrInvalidArgument error. Put reads r until io.EOF and makes the object visible only
	// after that: if r fails, ctx is cancelled or the upload fails, no new object appears
	// under key and the previous one, if any, is kept.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens the object, or the part of it that rng selects, for reading. The caller must
	// close the reader. A Range whose offset lies past the end is ErrInvalidArgument.
	Get(ctx context.Context, key string, rng Range) (io.ReadCloser, error)
	// Stat returns the object's size and modification time.
	Stat(ctx context.Context, key string) (Info, error)
	// List returns every object whose key starts with prefix (a plain string prefix, not a
	// directory), sorted by key. An empty prefix lists everything.
	List(ctx context.Context, prefix string) ([]Info, error)
	// Delete removes the object; a missing object is ErrNotFound.
	Delete(ctx context.Context, key string) error
}

// ValidateKey reports whether key is acceptable to every Store: a relative "/"-separated path
// with no empty, "." or ".." segments, no NUL, valid UTF-8, at most MaxKeyLen bytes. Errors
// wrap errdefs.ErrInvalidArgument.
func ValidateKey(key string) error { return base.ValidateKey(key) }

// ValidatePrefix reports whether prefix is acceptable to List.
func ValidatePrefix(prefix string) error { return base.ValidatePrefix(prefix) }
