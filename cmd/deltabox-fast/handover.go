package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"syscall"
)

// fromC is a request the C front (cfront.c) sent and handed over (cfront.h): Go reads the
// answer from where C stopped, with the code it reads its own answers with (wire.go, run.go),
// so that it prints the same result or error, and never sends the request again.
type fromC struct {
	kind    int // one of the fromC* kinds
	fd      int
	errno   syscall.Errno // fromCWriteErr
	readErr syscall.Errno // the error of C's last read (a socket reports it once), 0 for none
	raw     []byte        // read from fd, not used: the answer from its status line (fromCResponse) or the chunked body's rest
	pending []byte        // fromCEvents: the body, decoded, from an event line's start
	left    int64         // fromCEvents: bytes left in the current chunk
	crlf    bool          // fromCEvents: the CRLF after the current chunk is still to read
}

// The kinds of cfront.h.
const (
	fromCResponse = 1 // the answer from its first byte
	fromCEvents   = 2 // exec: a 200 with a chunked body, from an event boundary
	fromCWriteErr = 3 // writing the request failed
)

// sentByC is what the C front handed over (main sets it); request takes it once.
var sentByC *fromC

// response is the answer roundTrip would have read for the request C sent, or the error it
// would have returned.
func (h *fromC) response(address string) (*response, error) {
	if h.kind == fromCWriteErr {
		return nil, &os.PathError{Op: "write", Path: address, Err: h.errno} // os.File.Write's error
	}
	var conn io.Reader = os.NewFile(uintptr(h.fd), address)
	if h.readErr != 0 { // what os.File.Read returned to C's read: Go's next read returns it
		conn = io.MultiReader(&errOnce{&os.PathError{Op: "read", Path: address, Err: h.readErr}}, conn)
	}
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(h.raw), conn), 64<<10)
	if h.kind == fromCResponse {
		return readResponse(r)
	}
	body := io.MultiReader(bytes.NewReader(h.pending), &chunkedReader{r: r, left: h.left, crlf: h.crlf})
	return &response{status: "200 OK", code: 200, body: body}, nil
}

// errOnce returns its error once, then io.EOF (the connection's reads follow).
type errOnce struct{ err error }

func (e *errOnce) Read([]byte) (int, error) {
	err := e.err
	if err == nil {
		return 0, io.EOF
	}
	e.err = nil
	return 0, err
}
