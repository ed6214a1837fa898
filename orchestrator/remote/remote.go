package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// Options configure the TCP listener.
type Options struct {
	// Address is host:port to listen on.
	Address string
	// TokensFile holds the accepted bearer tokens.
	TokensFile string
	// CertFile and KeyFile are the server's certificate; empty: self-signed, kept in TLSDir.
	CertFile, KeyFile string
	// TLSDir keeps the self-signed certificate (cert.pem, key.pem).
	TLSDir string
	// ClientCAFile, when set, makes a client certificate signed by one of its CAs required.
	ClientCAFile string
}

// Server is the running TCP listener.
type Server struct {
	srv *http.Server
	l   net.Listener
	// Fingerprint is the SHA-256 of the server certificate (hex, colon-separated).
	Fingerprint string
	// CertFile is the server certificate's PEM file (the one clients trust when self-signed).
	CertFile string
}

// Addr is the address the listener is bound to.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Close stops the listener and its connections.
func (s *Server) Close() error { return s.srv.Close() }

// Serve starts the TCP listener for handler, behind TLS and Auth; it stops when ctx ends.
func Serve(ctx context.Context, o Options, handler http.Handler) (*Server, error) {
	tokens, err := LoadTokens(o.TokensFile)
	if err != nil {
		return nil, err
	}
	cert, certFile, err := serverCert(o)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if o.ClientCAFile != "" {
		pem, err := os.ReadFile(o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("api client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("api client CA file %s holds no PEM certificate: %w", o.ClientCAFile, errdefs.ErrInvalidArgument)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	l, err := net.Listen("tcp", o.Address)
	if err != nil {
		return nil, fmt.Errorf("api tcp listener: %w", err)
	}
	s := &Server{l: l, Fingerprint: fingerprint(cert.Certificate[0]), CertFile: certFile}
	s.srv = &http.Server{
		Handler:           Auth(ctx, tokens, handler),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
		// TLS handshake failures (scanners, clients that do not trust the certificate) at debug.
		ErrorLog: slog.NewLogLogger(log.L(ctx).Handler(), slog.LevelDebug),
	}
	go func() {
		if err := s.srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.L(ctx).Error("api tcp listener stopped", "error", err)
		}
	}()
	context.AfterFunc(ctx, func() { s.srv.Close() })
	log.L(ctx).Info("api tcp listener started", "address", l.Addr().String(), "tls_fingerprint_sha256", s.Fingerprint,
		"certificate", certFile, "tokens", tokens.Len(), "client_certificates", o.ClientCAFile != "")
	return s, nil
}

// Auth lets a request through only with an accepted bearer token (Authorization: Bearer T);
// any other gets 401 unauthenticated, and a warning is logged with the client's address and
// what was wrong, never the token.
func Auth(ctx context.Context, tokens *Tokens, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, why := bearer(r.Header.Get("Authorization"))
		ok, reloadErr := tokens.Valid(token)
		if reloadErr != nil {
			log.L(ctx).Error("api tokens file unusable: no token is accepted until it is fixed", "error", reloadErr)
		}
		if ok {
			next.ServeHTTP(w, r)
			return
		}
		if why == "" {
			why = "token not accepted"
		}
		log.L(ctx).Warn("api request refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "reason", why)
		w.Header().Set("WWW-Authenticate", `Bearer realm="deltabox"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: "unauthenticated",
			Message: "the DeltaBox API needs a valid bearer token (Authorization: Bearer TOKEN): " + why}})
	})
}

// bearer returns the token of an Authorization header, or why there is none.
func bearer(h string) (token, why string) {
	if h == "" {
		return "", "no Authorization header"
	}
	scheme, rest, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", "Authorization is not a Bearer token"
	}
	token = strings.TrimSpace(rest)
	if token == "" {
		return "", "empty bearer token"
	}
	return token, ""
}
