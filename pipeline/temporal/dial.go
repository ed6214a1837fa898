package temporal

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
)

// DialTimeout bounds how long connecting to Temporal may take before it is reported (a bad
// address fails `deltabox run` within 5 s).
const DialTimeout = 4 * time.Second

// Conn says how to reach a Temporal frontend.
type Conn struct {
	Address   string // host:port
	Namespace string // default "default"
	TLS       *tls.Config
	Logger    *slog.Logger // nil: discard the SDK's logs
}

// TLSFiles builds a client TLS config from PEM files: a CA bundle to verify the server
// (empty: the system roots), a client certificate and key (mutual TLS; both or neither),
// and the name the server's certificate must carry (empty: the address's host).
func TLSFiles(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("temporal tls_ca_file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("temporal tls_ca_file %s holds no PEM certificate: %w", caFile, errdefs.ErrInvalidArgument)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("temporal tls_cert_file and tls_key_file go together: %w", errdefs.ErrInvalidArgument)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("temporal client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Dial connects to Temporal within DialTimeout; the error names the address.
func Dial(ctx context.Context, c Conn) (client.Client, error) {
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		return nil, fmt.Errorf("temporal address %q: want HOST:PORT: %w", c.Address, errdefs.ErrInvalidArgument)
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNS
	}
	logger := c.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	tc, err := client.DialContext(ctx, client.Options{
		HostPort: c.Address, Namespace: c.Namespace, Logger: sdklog.NewStructuredLogger(logger),
		ConnectionOptions: client.ConnectionOptions{TLS: c.TLS},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to temporal at %s (namespace %s): %v: %w", c.Address, c.Namespace, err, errdefs.ErrUnavailable)
	}
	return tc, nil
}
