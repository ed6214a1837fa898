package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// The front's HTTP/1.1 client: one request on a unix socket connection of its own, written
// and then read by the only goroutine, as client.Options.OneShot does over net/http
// (orchestrator/client/oneshot.go) but without linking net/http: its package initialisers,
// its transport and crypto/tls cost ~75 page faults, 2-3 ms of every call on this class of
// VM. The request is what net/http's Request.Write sends for the same call (same headers, a
// Content-Length body), so the daemon cannot tell the two clients apart.

// dial connects to the unix socket path. The socket is blocking (no poller): with a full
// listen backlog connect waits where net.Dial would fail with EAGAIN. Its errors read as
// net.Dial's ("dial unix PATH: connect: ...").
func dial(path string) (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errors.New("dial unix " + path + ": socket: " + err.Error())
	}
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil && err != syscall.EISCONN {
		syscall.Close(fd)
		return nil, errors.New("dial unix " + path + ": connect: " + err.Error())
	}
	return os.NewFile(uintptr(fd), path), nil
}

// response is the status and body of the daemon's answer.
type response struct {
	status string // "404 Not Found"
	code   int
	body   io.Reader
}

// roundTrip sends method path (under /v1) with body and reads the answer's head.
func roundTrip(conn *os.File, method, path, contentType string, body []byte) (*response, error) {
	req := make([]byte, 0, 256+len(body))
	req = append(req, method+" /v1"+path+" HTTP/1.1\r\nHost: deltabox\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: "...)
	req = strconv.AppendInt(req, int64(len(body)), 10)
	req = append(req, "\r\nContent-Type: "+contentType+"\r\n\r\n"...)
	req = append(req, body...)
	if _, err := conn.Write(req); err != nil {
		return nil, err
	}
	return readResponse(bufio.NewReaderSize(conn, 64<<10))
}

// readResponse reads a response's status line and headers; its body reads the rest
// (Content-Length, chunked, or up to the end of the connection).
func readResponse(r *bufio.Reader) (*response, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	proto, status, ok := strings.Cut(line, " ")
	status = strings.TrimLeft(status, " ")
	codeText, _, _ := strings.Cut(status, " ")
	code, cerr := strconv.Atoi(codeText)
	if !ok || !strings.HasPrefix(proto, "HTTP/1.") || cerr != nil || len(codeText) != 3 {
		return nil, errors.New("malformed HTTP response " + strconv.Quote(line))
	}
	resp := &response{status: status, code: code}
	length, chunked := int64(-1), false
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, err
		}
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "content-length":
			if length, err = strconv.ParseInt(v, 10, 64); err != nil || length < 0 {
				return nil, errors.New("bad Content-Length " + strconv.Quote(v))
			}
		case "transfer-encoding":
			chunked = strings.EqualFold(v, "chunked")
		}
	}
	switch {
	case code == 204 || code == 304 || code < 200: // no body (RFC 9112 6.3)
		resp.body = strings.NewReader("")
	case chunked:
		resp.body = &chunkedReader{r: r}
	case length >= 0:
		resp.body = io.LimitReader(r, length)
	default:
		resp.body = r
	}
	return resp, nil
}

// readLine reads a CRLF (or LF) terminated line without its end; an end of stream before the
// line's end is io.ErrUnexpectedEOF.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}

// chunkedReader reads a chunked body (RFC 9112 7.1; the daemon's streams and its JSON
// answers over 2 KB come so).
type chunkedReader struct {
	r    *bufio.Reader
	left int64 // bytes left in the current chunk
	crlf bool  // the CRLF after a chunk is still to read (a body the C front began: handover.go)
	done bool
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.crlf {
		c.crlf = false
		if _, err := readLine(c.r); err != nil {
			return 0, err
		}
	}
	for c.left == 0 {
		if c.done {
			return 0, io.EOF
		}
		line, err := readLine(c.r)
		if err != nil {
			return 0, err
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			return 0, errors.New("malformed chunked encoding")
		}
		if n == 0 {
			for { // trailers, then the blank line
				if line, err = readLine(c.r); err != nil || line == "" {
					c.done = true
					if err != nil {
						return 0, err
					}
					break
				}
			}
			continue
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 && err == nil {
		if _, err = readLine(c.r); err != nil { // the CRLF after the chunk
			return n, err
		}
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
