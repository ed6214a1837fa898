package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/client"
)

//go:embed ui/index.html
var uiFiles embed.FS

// uiCommand serves the time-travel page (docs/time-travel.md) on a local address: plain HTML
// and JS from this binary, and a narrow proxy of the daemon's API for it.
func uiCommand() *cli.Command {
	return &cli.Command{
		Name:      "ui",
		Usage:     "serve the time-travel page of a sandbox (its checkpoint tree, diffs, rollback and fork) on a local address",
		ArgsUsage: "[ID]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:7878", Usage: "local address to serve on (port 0: any)"},
		},
		Action: runUI,
	}
}

func runUI(c *cli.Context) error {
	if c.NArg() > 1 {
		return usagef("ui takes [ID]")
	}
	host, _, err := net.SplitHostPort(c.String("listen"))
	if err != nil {
		return usagef("--listen %q: %v", c.String("listen"), err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return usagef("--listen %q: the page acts on sandboxes: serve it on a loopback address only", c.String("listen"))
	}
	ln, err := net.Listen("tcp", c.String("listen"))
	if err != nil {
		return err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	s := &uiServer{cl: newClient(c), token: hex.EncodeToString(tok), host: ln.Addr().String()}
	url := fmt.Sprintf("http://%s/?token=%s", s.host, s.token)
	if id := c.Args().First(); id != "" {
		url += "#" + id
	}
	fmt.Fprintln(c.App.Writer, url)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-c.Context.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// uiServer serves the page and forwards the few API calls it makes. Every API call must carry
// the token printed with the URL (in a header: a page of another origin cannot send it
// without a CORS preflight, which this server never answers) and name this server's own
// address as Host (no DNS rebinding).
type uiServer struct {
	cl    *client.Client
	token string
	host  string
}

// uiAPI lists what the page may call: method and path pattern under /v1 (compiled on first
// use, not at every CLI call's start-up).
var uiAPI = sync.OnceValue(func() []uiRoute {
	return []uiRoute{
		{http.MethodGet, regexp.MustCompile(`^/sandboxes$`)},
		{http.MethodGet, regexp.MustCompile(`^/sandboxes/[A-Za-z0-9_.-]+/(checkpoints|log|diff|state)$`)},
		{http.MethodPost, regexp.MustCompile(`^/sandboxes/[A-Za-z0-9_.-]+/(rollback|fork)$`)},
	}
})

// uiRoute is one method and path pattern the page may call.
type uiRoute struct {
	method string
	path   *regexp.Regexp
}

func (s *uiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Host != s.host {
		http.Error(w, "wrong host", http.StatusForbidden)
		return
	}
	switch {
	case r.URL.Path == "/" && r.Method == http.MethodGet:
		page, _ := uiFiles.ReadFile("ui/index.html")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		w.Header().Set("X-Frame-Options", "DENY")
		_, _ = w.Write(page)
	case strings.HasPrefix(r.URL.Path, "/v1/"):
		s.forward(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (s *uiServer) forward(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Deltabox-Token")), []byte(s.token)) != 1 {
		http.Error(w, "missing or wrong token", http.StatusForbidden)
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/v1")
	allowed := false
	for _, a := range uiAPI() {
		allowed = allowed || (a.method == r.Method && a.path.MatchString(p))
	}
	if !allowed {
		http.Error(w, "not an API call the page makes", http.StatusForbidden)
		return
	}
	if r.URL.RawQuery != "" {
		p += "?" + r.URL.RawQuery
	}
	resp, err := s.cl.Forward(r.Context(), r.Method, p, http.MaxBytesReader(w, r.Body, 1<<20), r.Header.Get("Content-Type"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
