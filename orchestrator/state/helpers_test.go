package state

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

// classOf names the errdefs class of err, as the API would.
func classOf(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return "failed_precondition"
	case errors.Is(err, errdefs.ErrNotFound):
		return "not_found"
	case errors.Is(err, errdefs.ErrConflict):
		return "conflict"
	case errors.Is(err, errdefs.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, errdefs.ErrDataLoss):
		return "data_loss"
	}
	return "other"
}

// canon returns the canonical encoding of a JSON text.
func canon(t testing.TB, raw []byte) string {
	t.Helper()
	v, err := decodeValue(raw)
	if err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	b, err := encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustOps(t testing.TB, s string) []Op {
	t.Helper()
	ops, err := ParseOps([]byte(s))
	if err != nil {
		t.Fatalf("ParseOps(%s): %v", s, err)
	}
	return ops
}

func openStore(t testing.TB, dir string, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), dir, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func patch(t testing.TB, s *Store, ops string) PatchResult {
	t.Helper()
	res, err := s.Patch(context.Background(), mustOps(t, ops), PatchOptions{})
	if err != nil {
		t.Fatalf("Patch(%s): %v", ops, err)
	}
	return res
}

func getDoc(t testing.TB, s *Store) string {
	t.Helper()
	b, err := s.Get("")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return string(b)
}

func wantDoc(t testing.TB, s *Store, want string) {
	t.Helper()
	if got := getDoc(t, s); got != canon(t, []byte(want)) {
		t.Fatalf("document = %s, want %s", got, canon(t, []byte(want)))
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
