//go:build !cli

package main

import (
	"context"
	"net/http"
	"path/filepath"

	"github.com/deltabox/deltabox/internal/config"
	"github.com/deltabox/deltabox/orchestrator"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/remote"
)

// serveRemote starts the host API's TCP listener (TLS and bearer tokens) when [api] tcp_address
// is set; it stops with ctx.
func serveRemote(ctx context.Context, c config.API, root string, o *orchestrator.Orchestrator, h http.Handler) error {
	if c.TCPAddress == "" {
		return nil
	}
	s, err := remote.Serve(ctx, remote.Options{
		Address: c.TCPAddress, TokensFile: c.TokensFile, CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile,
		TLSDir: filepath.Join(root, "api-tls"), ClientCAFile: c.ClientCAFile,
	}, h)
	if err != nil {
		return err
	}
	o.SetRemoteAPI(api.RemoteAPI{Address: s.Addr().String(), TLSFingerprint: s.Fingerprint, Certificate: s.CertFile,
		ClientCertificates: c.ClientCAFile != ""})
	return nil
}
