package initproto_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/pool/initproto"
)

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	initproto.WriteFrame(&b, initproto.FrameStdout, []byte("hello"))
	initproto.WriteFrame(&b, initproto.FrameStdinEOF, nil)
	var buf []byte
	typ, p, err := initproto.ReadFrame(&b, &buf)
	if err != nil || typ != initproto.FrameStdout || string(p) != "hello" {
		t.Fatalf("got %d %q %v", typ, p, err)
	}
	typ, p, err = initproto.ReadFrame(&b, &buf)
	if err != nil || typ != initproto.FrameStdinEOF || len(p) != 0 {
		t.Fatalf("got %d %q %v", typ, p, err)
	}
	if _, _, err := initproto.ReadFrame(&b, &buf); err != io.EOF {
		t.Fatalf("at end: %v, want io.EOF", err)
	}
	if err := initproto.WriteFrame(&b, initproto.FrameStdinEOF, []byte("x")); !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("EOF frame with payload: %v", err)
	}
	if _, _, err := initproto.ReadFrame(bytes.NewReader([]byte{3, 0, 0, 0, 9, 'a'}), &buf); !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("truncated payload: %v", err)
	}
}

func TestReadRequest(t *testing.T) {
	line, err := initproto.EncodeRequest(initproto.Request{Op: initproto.OpExec, Exec: &initproto.ExecRequest{Argv: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := initproto.ReadRequest(bufio.NewReaderSize(bytes.NewReader(line), 16))
	if err != nil || req.Version != initproto.Version || req.Exec.Argv[0] != "true" {
		t.Fatalf("got %+v %v", req, err)
	}
	// Unknown fields are ignored (forward compatibility).
	if _, err := initproto.ReadRequest(bufio.NewReader(strings.NewReader(`{"v":1,"op":"ping","new":1}` + "\n"))); err != nil {
		t.Fatalf("unknown field: %v", err)
	}
	huge := strings.Repeat("x", initproto.MaxRequestSize+10) + "\n"
	if _, err := initproto.ReadRequest(bufio.NewReader(strings.NewReader(huge))); !errors.Is(err, initproto.ErrProtocol) {
		t.Fatalf("oversized request: %v", err)
	}
}
