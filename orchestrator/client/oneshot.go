package client

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
)

// oneShot is the http.RoundTripper of Options.OneShot: every request dials a connection of
// its own, written and read by the calling goroutine, and closing the response body closes
// it. http.Transport would start a dial goroutine, a read loop and a write loop, and pool
// the connection: a process that makes one request and exits pays for those in page faults
// and threads (~35 faults, ~2 ms of `deltabox lease` on a VM where a fault costs ~30 us).
type oneShot struct {
	address string
}

func (t oneShot) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", t.address)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() }) // cancelling fails the reads and writes
	fail := func(err error) (*http.Response, error) {
		stop()
		conn.Close()
		return nil, err
	}
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength > 0 {
		if err := req.Write(conn); err != nil {
			return fail(err)
		}
	} else {
		// A body of unknown length (exec's stdin, terminal input, a tar stream) goes out
		// while the answer comes in: the daemon streams both ways at once.
		go req.Write(conn) // a failed write shows as a failed read
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fail(err)
	}
	resp.Body = &connBody{ReadCloser: resp.Body, conn: conn, stop: stop}
	return resp, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// connBody is a response body that closes its connection when closed.
type connBody struct {
	io.ReadCloser
	conn net.Conn
	stop func() bool
}

func (b *connBody) Close() error {
	b.stop()
	err := b.ReadCloser.Close()
	if cerr := b.conn.Close(); err == nil {
		err = cerr
	}
	return err
}
