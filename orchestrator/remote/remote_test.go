package remote

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/log"
	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

const (
	tokenA = "token-aaaaaaaaaaaaaaaa"
	tokenB = "token-bbbbbbbbbbbbbbbb"
)

func writeTokens(t *testing.T, path string, lines ...string) {
	t.Helper()
	// Through a rename, as a rotation would, so a reader never sees half a file.
	if err := os.WriteFile(path+".new", []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

func valid(t *testing.T, tk *Tokens, token string) bool {
	t.Helper()
	time.Sleep(statInterval + 10*time.Millisecond) // past the stat interval: a change is seen
	ok, _ := tk.Valid(token)
	return ok
}

func TestTokensRotateAndFailClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, "# the CI's token", tokenA, "")
	tk, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	if !valid(t, tk, tokenA) || valid(t, tk, tokenB) || valid(t, tk, "") || valid(t, tk, tokenA[:len(tokenA)-1]) {
		t.Fatal("only token A should be accepted")
	}
	writeTokens(t, path, tokenB) // rotate: A out, B in, no restart
	if valid(t, tk, tokenA) || !valid(t, tk, tokenB) {
		t.Fatal("after the rotation only token B should be accepted")
	}
	writeTokens(t, path, "short") // a broken file accepts nothing, and says why
	time.Sleep(statInterval + 10*time.Millisecond)
	if ok, reload := tk.Valid(tokenB); ok || reload == nil || !strings.Contains(reload.Error(), "line 1") {
		t.Fatalf("a broken tokens file: ok %v, reload error %v", ok, reload)
	}
	time.Sleep(statInterval + 10*time.Millisecond)
	if ok, reload := tk.Valid(tokenB); ok || reload != nil {
		t.Fatalf("a tokens file still broken: ok %v, reload error reported again: %v", ok, reload)
	}
	writeTokens(t, path, tokenB)
	if !valid(t, tk, tokenB) {
		t.Fatal("the fixed file should be read again")
	}
	for _, bad := range [][]string{{}, {"# only a comment"}, {"has a space in it ok"}} {
		writeTokens(t, path, bad...)
		if _, err := LoadTokens(path); err == nil {
			t.Errorf("tokens file %q was accepted", bad)
		}
	}
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing tokens file was accepted")
	}
}

func TestAuthRefusesWithoutLeakingTheToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, tokenA)
	tk, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer // a log sink safe for the server's goroutines
	ctx := log.WithLogger(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
	h := Auth(ctx, tk, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "in") }))
	wrong := "wrong-token-0123456789"
	for _, c := range []struct{ header, why string }{
		{"", "no Authorization header"},
		{"Basic dXNlcjpwYXNz", "not a Bearer token"},
		{"Bearer ", "empty bearer token"},
		{"Bearer " + wrong, "token not accepted"},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/v1/info", nil)
		if c.header != "" {
			req.Header.Set("Authorization", c.header)
		}
		h.ServeHTTP(rec, req)
		var body api.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != 401 || body.Error.Code != "unauthenticated" ||
			!strings.Contains(body.Error.Message, c.why) || rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%q: %d %s", c.header, rec.Code, rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/v1/info", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	h.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Body.String() != "in" {
		t.Fatalf("the right token: %d %s", rec.Code, rec.Body)
	}
	out := logs.String()
	if strings.Count(out, "api request refused") != 4 || !strings.Contains(out, "token not accepted") {
		t.Errorf("refusals not logged:\n%s", out)
	}
	if strings.Contains(out, wrong) || strings.Contains(out, tokenA) || strings.Contains(out, "dXNlcjpwYXNz") {
		t.Errorf("the log shows a credential:\n%s", out)
	}
}

func TestServeSelfSignedAndMTLS(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	writeTokens(t, tokens, tokenA)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	s, err := Serve(ctx, Options{Address: "127.0.0.1:0", TokensFile: tokens, TLSDir: filepath.Join(dir, "tls")}, h)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "tls", "key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("self-signed key: %v %v", fi, err)
	}
	pool := x509.NewCertPool()
	serverPEM, _ := os.ReadFile(s.CertFile)
	pool.AppendCertsFromPEM(serverPEM)
	url := "https://" + s.Addr().String() + "/v1/info"
	get := func(c *http.Client, token string) (int, error) {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if code, err := get(trusting, tokenA); err != nil || code != 200 {
		t.Fatalf("trusted certificate, right token: %d %v", code, err)
	}
	if code, _ := get(trusting, tokenB); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	if _, err := get(http.DefaultClient, tokenA); err == nil {
		t.Fatal("a client that does not trust the self-signed certificate got through")
	}
	if resp, err := http.Get("http://" + s.Addr().String() + "/v1/info"); err == nil && resp.StatusCode == 200 {
		t.Fatal("plain HTTP reached the API")
	}
	// The same certificate is kept across restarts.
	s.Close()
	s2, err := Serve(ctx, Options{Address: "127.0.0.1:0", TokensFile: tokens, TLSDir: filepath.Join(dir, "tls")}, h)
	if err != nil || s2.Fingerprint != s.Fingerprint || len(s.Fingerprint) != 95 {
		t.Fatalf("restart: %v, fingerprint %s then %s", err, s.Fingerprint, s2.Fingerprint)
	}
	s2.Close()
	// mTLS: clients need a certificate signed by the client CA.
	caFile, clientCert := clientCA(t, dir)
	s3, err := Serve(ctx, Options{Address: "127.0.0.1:0", TokensFile: tokens, TLSDir: filepath.Join(dir, "tls"),
		ClientCAFile: caFile}, h)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	url = "https://" + s3.Addr().String() + "/v1/info"
	if _, err := get(trusting, tokenA); err == nil {
		t.Fatal("mTLS: a client without a certificate got through")
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}}}}
	if code, err := get(withCert, tokenA); err != nil || code != 200 {
		t.Fatalf("mTLS with a client certificate: %d %v", code, err)
	}
	if code, _ := get(withCert, tokenB); code != 401 {
		t.Fatalf("mTLS does not replace the token: %d", code)
	}
}

// clientCA makes a CA (its PEM file) and a client certificate it signed.
func clientCA(t *testing.T, dir string) (string, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "client"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "client-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
