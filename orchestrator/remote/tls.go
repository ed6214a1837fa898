package remote

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/deltabox/deltabox/internal/atomicfile"
)

// serverCert loads the configured certificate, or the self-signed one kept in o.TLSDir (made
// there the first time); the certificate and the PEM file clients can trust.
func serverCert(o Options) (tls.Certificate, string, error) {
	if o.CertFile != "" {
		c, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return c, "", fmt.Errorf("api tls certificate: %w", err)
		}
		return c, o.CertFile, nil
	}
	certFile, keyFile := filepath.Join(o.TLSDir, "cert.pem"), filepath.Join(o.TLSDir, "key.pem")
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err == nil {
		if leaf, perr := x509.ParseCertificate(c.Certificate[0]); perr == nil && time.Now().Before(leaf.NotAfter.Add(-24*time.Hour)) {
			return c, certFile, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return c, "", fmt.Errorf("api self-signed certificate in %s: %w (remove it to make a new one)", o.TLSDir, err)
	}
	if err := selfSign(o.Address, certFile, keyFile); err != nil {
		return tls.Certificate{}, "", err
	}
	c, err = tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return c, "", fmt.Errorf("api self-signed certificate: %w", err)
	}
	return c, certFile, nil
}

// selfSign makes a self-signed ECDSA P-256 certificate, valid for 10 years, for the
// listener's host, this host's names and addresses, and loopback.
func selfSign(address, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("api self-signed certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return fmt.Errorf("api self-signed certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "deltabox daemon", Organization: []string{"DeltaBox"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	tmpl.DNSNames, tmpl.IPAddresses = certNames(address)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("api self-signed certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("api self-signed certificate: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return fmt.Errorf("api self-signed certificate: %w", err)
	}
	if err := atomicfile.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", keyFile, err)
	}
	if err := atomicfile.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", certFile, err)
	}
	return nil
}

// certNames are the names a self-signed certificate covers.
func certNames(address string) ([]string, []net.IP) {
	dns := []string{"localhost"}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if h, err := os.Hostname(); err == nil && h != "" {
		dns = append(dns, h)
	}
	host, _, _ := net.SplitHostPort(address)
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		ips = append(ips, ip)
	} else if host != "" && ip == nil {
		dns = append(dns, host)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil { // a wildcard listener answers on all of them
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				ips = append(ips, n.IP)
			}
		}
	}
	return dns, ips
}

// fingerprint is the SHA-256 of a DER certificate, as colon-separated hex.
func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	h := strings.ToUpper(hex.EncodeToString(sum[:]))
	parts := make([]string, 0, len(sum))
	for i := 0; i < len(h); i += 2 {
		parts = append(parts, h[i:i+2])
	}
	return strings.Join(parts, ":")
}
