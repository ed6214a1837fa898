// Package client is the Go client of DeltaBox's HTTP/JSON API over its unix socket (or over
// TCP with TLS and a bearer token: Dial). The CLI
// is built on it; pipelines in Go can use it directly. Errors from the daemon come back as
// errdefs classes (errdefs.IsNotFound(err) and so on).
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errhttp"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// DefaultAddress is the daemon's default API socket.
const DefaultAddress = "/run/deltabox/deltabox.sock"

// Client talks to one daemon.
type Client struct {
	address string
	http    *http.Client
	// base is the URL requests go to: http://deltabox over the socket, https://host:port on TCP.
	base string
	// token is the bearer token sent on TCP.
	token string
	// err, when set, fails every request (Dial's error, for callers that report it late).
	err error
}

// Options are what a client needs for a tcp:// daemon: TLS and a bearer token.
type Options struct {
	// Token is the bearer token (required on TCP).
	Token string
	// CAFile is a PEM file of the CA (or the daemon's self-signed certificate) to trust;
	// empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate, for a daemon that asks for one (mTLS).
	CertFile, KeyFile string
	// OneShot, on a unix socket, sends every request on a connection of its own, written and
	// read by the calling goroutine, with no connection pool and no transport goroutines:
	// for a process that makes a request or two and exits, such as the CLI (oneshot.go).
	OneShot bool
}

// Dial returns a client for address: a unix socket (/path or unix:///path), or tcp://host:port
// (TLS, with the token and certificates of o).
func Dial(address string, o Options) (*Client, error) {
	rest, ok := strings.CutPrefix(address, "tcp://")
	if !ok {
		if p, ok := strings.CutPrefix(address, "unix://"); ok {
			address = p
		}
		if strings.Contains(address, "://") {
			return nil, fmt.Errorf("daemon address %q: want a unix socket path or tcp://host:port: %w", address, errdefs.ErrInvalidArgument)
		}
		if o.OneShot {
			return &Client{address: address, http: &http.Client{Transport: oneShot{address: address}}, base: "http://deltabox"}, nil
		}
		return New(address), nil
	}
	if _, _, err := net.SplitHostPort(rest); err != nil || strings.ContainsAny(rest, "/?#") {
		return nil, fmt.Errorf("daemon address %q: want tcp://host:port: %w", address, errdefs.ErrInvalidArgument)
	}
	if o.Token == "" {
		return nil, fmt.Errorf("daemon address %s: a tcp:// daemon needs a token (--token-file or DELTABOX_TOKEN): %w", address, errdefs.ErrInvalidArgument)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pemData, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pemData) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate: %w", o.CAFile, errdefs.ErrInvalidArgument)
		}
	}
	if o.CertFile != "" || o.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second, Proxy: nil}
	return &Client{address: address, http: &http.Client{Transport: tr}, base: "https://" + rest, token: o.Token}, nil
}

// Failed returns a client whose every request fails with err.
func Failed(address string, err error) *Client { return &Client{address: address, err: err} }

// New returns a client for the daemon listening on the unix socket address.
func New(address string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", address)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{address: address, http: &http.Client{Transport: tr}, base: "http://deltabox"}
}

// Address is the socket this client dials.
func (c *Client) Address() string { return c.address }

// Info returns the daemon's info document.
func (c *Client) Info(ctx context.Context) (api.Info, error) {
	var info api.Info
	err := c.do(ctx, http.MethodGet, "/info", nil, &info)
	return info, err
}

// do sends a JSON request to path (under /v1) and decodes the JSON answer into out.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	// Read to the end (the encoder's newline, a chunked body's trailer): a body closed
	// before its end closes the connection instead of returning it for the next request.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}

// send issues a JSON request and turns an error response into an error; the caller closes
// the body of a successful response.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(data)
	}
	return c.sendRaw(ctx, method, path, body, "application/json")
}

// sendRaw issues a request with the given body and content type.
func (c *Client) sendRaw(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, path, body, contentType)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if uerr := (*url.Error)(nil); errors.As(err, &uerr) {
		err = uerr.Err
	}
	if err != nil && ctx.Err() != nil {
		// The caller gave up (cancelled, or its deadline passed): say so, keeping
		// context.Canceled or context.DeadlineExceeded, not "cannot reach the daemon".
		return nil, fmt.Errorf("%s %s: %w", method, path, ctxErr(ctx, err))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot reach the DeltaBox daemon at %s (is `deltabox daemon` running?): %v: %w",
			c.address, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// newRequest builds a request to the daemon's API (path and query under /v1) with the
// client's token and, when given, the content type.
func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Request, error) {
	if c.err != nil {
		return nil, c.err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+api.Version+path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req, nil
}

func decodeError(resp *http.Response) error {
	var body api.ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(data, &body); err != nil || body.Error.Code == "" {
		return fmt.Errorf("daemon answered %s: %s: %w", resp.Status, bytes.TrimSpace(data), errhttp.ToNative(resp.StatusCode))
	}
	return api.ToErrorStatus(body.Error, resp.StatusCode)
}

// ctxErr returns err so that errors.Is finds ctx's error in it (context.Canceled or
// context.DeadlineExceeded), whatever the transport made of the cancellation.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%v: %w", err, cerr)
	}
	return err
}
