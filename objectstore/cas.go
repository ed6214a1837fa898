package objectstore

import (
	"context"
	_ "crypto/sha256" // registers sha256 for go-digest
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

// ErrDigestMismatch is wrapped by every error about content that does not match its digest.
// It wraps errdefs.ErrDataLoss.
var ErrDigestMismatch = fmt.Errorf("content digest mismatch: %w", errdefs.ErrDataLoss)

// DefaultCASPrefix is the key prefix under which a CAS keeps its blobs unless told otherwise.
const DefaultCASPrefix = "blobs/"

// CAS keeps content-addressed blobs in a Store, under keys derived from their sha256 digest
// (<prefix>sha256/<hex>). Blobs that already exist are not uploaded again, and every read is
// verified against the digest.
type CAS struct {
	store  Store
	prefix string
}

// CASOption configures a CAS.
type CASOption func(*CAS)

// WithCASPrefix sets the key prefix of the blobs (default DefaultCASPrefix). A non-empty
// prefix should end with "/".
func WithCASPrefix(prefix string) CASOption {
	return func(c *CAS) { c.prefix = prefix }
}

// NewCAS returns a CAS over s.
func NewCAS(s Store, opts ...CASOption) *CAS {
	c := &CAS{store: s, prefix: DefaultCASPrefix}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Key returns the key under which the blob with digest d is stored. Only sha256 digests are
// accepted; others are ErrInvalidArgument.
func (c *CAS) Key(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("blob digest %q: %w: %w", d, errdefs.ErrInvalidArgument, err)
	}
	if d.Algorithm() != digest.SHA256 {
		return "", fmt.Errorf("blob digest %s: only sha256 is supported: %w", d, errdefs.ErrInvalidArgument)
	}
	key := c.prefix + "sha256/" + d.Encoded()
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// Has reports whether the blob with digest d is stored.
func (c *CAS) Has(ctx context.Context, d digest.Digest) (bool, error) {
	_, err := c.Stat(ctx, d)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Stat returns the stored blob's Info; a missing blob is ErrNotFound.
func (c *CAS) Stat(ctx context.Context, d digest.Digest) (Info, error) {
	key, err := c.Key(d)
	if err != nil {
		return Info{}, err
	}
	info, err := c.store.Stat(ctx, key)
	if err != nil {
		return Info{}, fmt.Errorf("stat blob %s: %w", d, err)
	}
	return info, nil
}

// Put stores the bytes of r as the blob with digest d and reports whether it uploaded them.
// If a blob with that digest (and, when size >= 0, that size) is already stored, Put returns
// (false, nil) without reading r. Otherwise the bytes are hashed while they stream to the
// store; if they do not match d, the upload is abandoned (nothing becomes visible) and the
// error wraps ErrDigestMismatch. size is the number of bytes, or -1 when unknown.
func (c *CAS) Put(ctx context.Context, d digest.Digest, r io.Reader, size int64) (bool, error) {
	key, err := c.Key(d)
	if err != nil {
		return false, err
	}
	info, err := c.store.Stat(ctx, key)
	switch {
	case err == nil && (size < 0 || info.Size == size):
		return false, nil
	case err != nil && !errdefs.IsNotFound(err):
		return false, fmt.Errorf("put blob %s: %w", d, err)
	}
	vr := newVerifier(r, d)
	defer vr.stop()
	if err := c.store.Put(ctx, key, vr, size); err != nil {
		return false, fmt.Errorf("put blob %s: %w", d, err)
	}
	if !vr.verified {
		// The store committed without reading to EOF: a backend bug that would let
		// unverified bytes in. Take them out again.
		_ = c.store.Delete(context.WithoutCancel(ctx), key)
		return false, fmt.Errorf("put blob %s: store did not read the content to the end: %w", d, errdefs.ErrFailedPrecondition)
	}
	return true, nil
}

// Get opens the blob with digest d. The reader verifies the bytes as they pass: when it
// reaches the end and the content does not match d, Read returns an error wrapping
// ErrDigestMismatch instead of io.EOF, so a caller that reads to io.EOF never accepts
// wrong data.
func (c *CAS) Get(ctx context.Context, d digest.Digest) (io.ReadCloser, error) {
	key, err := c.Key(d)
	if err != nil {
		return nil, err
	}
	rc, err := c.store.Get(ctx, key, Range{})
	if err != nil {
		return nil, fmt.Errorf("get blob %s: %w", d, err)
	}
	return &verifiedReader{verifier: newVerifier(rc, d), rc: rc}, nil
}

// Delete removes the blob with digest d.
func (c *CAS) Delete(ctx context.Context, d digest.Digest) error {
	key, err := c.Key(d)
	if err != nil {
		return err
	}
	if err := c.store.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete blob %s: %w", d, err)
	}
	return nil
}

// verifier hashes what passes through it and turns io.EOF into a mismatch error when the
// content does not match the expected digest. Its error is sticky. The hash runs on a
// goroutine of its own, fed copies of what was read (bounded: hashChunks in flight), so that
// hashing overlaps with what the caller does with the bytes: hashing 50 MiB with SHA-256
// takes ~45 ms here, as long as decompressing and writing them, and the two otherwise took
// turns on one core. The final check waits for the hash to catch up.
type verifier struct {
	r        io.Reader
	want     digest.Digest
	h        hash.Hash
	err      error
	verified bool
	chunks   chan []byte   // to the hashing goroutine; closed at the end (or Close)
	free     chan []byte   // buffers back from it
	hashed   chan struct{} // closed once it has hashed every chunk sent
}

// hashChunks and hashChunkSize bound the copies in flight to the hashing goroutine.
const (
	hashChunks    = 8
	hashChunkSize = 256 << 10
)

func newVerifier(r io.Reader, want digest.Digest) *verifier {
	v := &verifier{r: r, want: want, h: want.Algorithm().Hash(), chunks: make(chan []byte, hashChunks),
		free: make(chan []byte, hashChunks), hashed: make(chan struct{})}
	for range hashChunks {
		v.free <- make([]byte, hashChunkSize)
	}
	go func(chunks <-chan []byte) {
		defer close(v.hashed)
		for b := range chunks {
			v.h.Write(b)
			v.free <- b[:cap(b)]
		}
	}(v.chunks)
	return v
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	for rest := p[:n]; len(rest) > 0; {
		b := <-v.free
		m := copy(b, rest)
		v.chunks <- b[:m]
		rest = rest[m:]
	}
	if errors.Is(err, io.EOF) {
		err = v.check()
	}
	if err != nil {
		v.err = err
	}
	return n, err
}

// stop ends the hashing goroutine (at the end of the content, or when the reader is closed
// before it); it is safe to call more than once.
func (v *verifier) stop() {
	if v.chunks != nil {
		close(v.chunks)
		v.chunks = nil
	}
	<-v.hashed
}

func (v *verifier) check() error {
	v.stop()
	got := digest.NewDigest(v.want.Algorithm(), v.h)
	if got != v.want {
		return fmt.Errorf("blob %s: content has digest %s: %w", v.want, got, ErrDigestMismatch)
	}
	v.verified = true
	return io.EOF
}

// verifiedReader is a blob opened by Get: its verifier, and the store's reader behind it.
type verifiedReader struct {
	*verifier
	rc io.ReadCloser
}

// Close stops the hashing and closes the blob.
func (r *verifiedReader) Close() error {
	r.verifier.stop()
	return r.rc.Close()
}
