package state

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// Repeated "copy" of a subtree into itself doubles its depth each time; the op that would
// pass the depth limit is refused with invalid_argument and the patch leaves nothing behind.
func TestRepeatedCopyIsBoundedByDepth(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	patch(t, s, `{"op":"add","path":"/a","value":{"x":{}}}`)
	path := "/a"
	var err error
	for i := 0; i < 20 && err == nil; i++ {
		deepest := path + strings.Repeat("/x", 1<<i)
		_, err = s.Patch(context.Background(), mustOps(t, fmt.Sprintf(`[{"op":"copy","from":%q,"path":%q}]`, path, deepest+"/x")), PatchOptions{})
	}
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "deeper than the limit of 128") {
		t.Fatalf("copy past the depth limit = %v, want invalid_argument naming the limit", err)
	}
	v, _ := s.Get("")
	root, _ := decodeValue(v)
	if deeperThan(root, DefaultMaxDepth) {
		t.Fatal("the document is deeper than the limit")
	}
}

func TestDeepValuesAndPathsAreRefused(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	deep := strings.Repeat("[", 128) + strings.Repeat("]", 128)
	patch(t, s, `{"op":"add","path":"","value":`+deep+`}`) // exactly at the limit
	for _, op := range []string{
		`{"op":"add","path":"/k","value":` + deep + `}`,
		`{"op":"add","path":"","value":[` + deep + `]}`,
		`{"op":"replace","path":"/0","value":` + deep + `}`,
		`{"op":"append","path":"/0","value":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`,
	} {
		_, err := s.Patch(context.Background(), mustOps(t, "["+op+"]"), PatchOptions{})
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("%.60s...: %v, want invalid_argument", op, err)
		}
	}
	patch(t, s, `{"op":"add","path":"","value":{"a":{"b":{}}}}`) // small documents still work
	patch(t, s, `{"op":"move","from":"/a/b","path":"/c"}`)
}

// Each op is held to the size limit as it applies: a patch of copies that doubles the
// document is refused at the op that passes it, long before the document could grow huge.
func TestCopyDoublingIsBoundedBySize(t *testing.T) {
	s := openStore(t, t.TempDir(), WithMaxDocumentSize(1<<20))
	defer s.Close()
	patch(t, s, `{"op":"add","path":"/a","value":"`+strings.Repeat("x", 1000)+`"}`)
	var ops []string
	for i := 0; i < 60; i++ {
		ops = append(ops, fmt.Sprintf(`{"op":"copy","from":"","path":"/c%d"}`, i))
	}
	_, err := s.Patch(context.Background(), mustOps(t, "["+strings.Join(ops, ",")+"]"), PatchOptions{})
	var oe *OpError
	if !errdefs.IsInvalidArgument(err) || !errors.As(err, &oe) || oe.Index > 12 {
		t.Fatalf("doubling patch = %v, want invalid_argument at about op 10", err)
	}
	if v, _ := s.Get(""); len(v) > 2000 {
		t.Fatalf("the refused patch left %d bytes", len(v))
	}
}

// A log written without the depth limit (an older version) must not bring the next Open
// down: it is refused with an error naming the limit.
func TestReplayOfTooDeepLogIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, WithMaxDepth(0))
	patch(t, s, `{"op":"add","path":"/a","value":{"x":{}}}`)
	path := "/a"
	for i := 0; i < 8; i++ {
		patch(t, s, fmt.Sprintf(`{"op":"copy","from":%q,"path":%q}`, path, path+strings.Repeat("/x", 1<<i)+"/x"))
	}
	noErr(t, s.Close())
	_, err := Open(context.Background(), dir)
	if err == nil || !strings.Contains(err.Error(), "deeper than the limit") {
		t.Fatalf("Open of a too deep log = %v", err)
	}
	s = openStore(t, dir, WithMaxDepth(1000)) // an operator may raise the limit to read it
	noErr(t, s.Close())
}
