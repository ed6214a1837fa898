// Package storetest is the conformance suite for objectstore backends, in the style of
// containerd's snapshots/testsuite: Run executes the same cases against any Store, so the
// local and S3 backends are held to one contract. It must not know about any backend.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore"
)

// Factory returns a new, empty store for one test case; it registers its own cleanup.
type Factory func(t *testing.T) objectstore.Store

// Run runs every conformance case against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	cases := []struct {
		name string
		fn   func(*testing.T, objectstore.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"Range", testRange},
		{"RangeEmptyObject", testRangeEmpty},
		{"Stat", testStat},
		{"List", testList},
		{"Delete", testDelete},
		{"Overwrite", testOverwrite},
		{"SizeMismatch", testSizeMismatch},
		{"FailingReader", testFailingReader},
		{"InvalidKeys", testInvalidKeys},
		{"ContextCancel", testContextCancel},
		{"Concurrent", testConcurrent},
		{"CASDedup", testCASDedup},
		{"CASMismatchOnRead", testCASMismatchOnRead},
		{"CASMismatchOnPut", testCASMismatchOnPut},
		{"CASInvalidDigest", testCASInvalidDigest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newStore(t)) })
	}
}

// data returns n deterministic pseudo-random bytes.
func data(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(n), byte(n >> 8), byte(n >> 16)})
	_, _ = r.Read(b)
	return b
}

// streamOnly hides bytes.Reader's Seek/WriterTo/Len so backends see a plain stream.
type streamOnly struct{ r io.Reader }

func (s streamOnly) Read(p []byte) (int, error) { return s.r.Read(p) }

func put(t *testing.T, s objectstore.Store, key string, b []byte, size int64) {
	t.Helper()
	if err := s.Put(context.Background(), key, streamOnly{bytes.NewReader(b)}, size); err != nil {
		t.Fatalf("Put(%q, %d bytes, size %d): %v", key, len(b), size, err)
	}
}

func get(t *testing.T, s objectstore.Store, key string, rng objectstore.Range) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key, rng)
	if err != nil {
		t.Fatalf("Get(%q, %+v): %v", key, rng, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%q, %+v): read: %v", key, rng, err)
	}
	return b
}

func checkBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %d bytes, want %d (contents differ)", what, len(got), len(want))
	}
}

func wantErr(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("%s: error %v, want one wrapping %v", what, err, class)
	}
}

// requireAbsent fails unless key is missing (Stat is ErrNotFound).
func requireAbsent(t *testing.T, s objectstore.Store, key string) {
	t.Helper()
	_, err := s.Stat(context.Background(), key)
	wantErr(t, "Stat("+key+") of an object that must not exist", err, errdefs.ErrNotFound)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
