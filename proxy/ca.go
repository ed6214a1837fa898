package proxy

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
)

const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca-key.pem"
	caValidity = 10 * 365 * 24 * time.Hour
	leafTTL    = 7 * 24 * time.Hour
)

// authority is the node CA and the bounded cache of the leaf certificates it issued.
type authority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	leafKey *ecdsa.PrivateKey // one key for all leaves: minting is a signature, not a keygen
	now     func() time.Time

	mu    sync.Mutex
	lru   *list.List // of *leafEntry, most recent first
	byKey map[string]*list.Element
	size  int
}

type leafEntry struct {
	host string
	cert *tls.Certificate
}

// loadOrCreateCA reads dir/ca.pem and dir/ca-key.pem, or creates them on first start.
func loadOrCreateCA(dir string, now func() time.Time, cacheSize int) (*authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA dir: %w", err)
	}
	certPEM, keyPEM, err := readCAFiles(dir)
	if errors.Is(err, fs.ErrNotExist) {
		certPEM, keyPEM, err = createCA(dir, now())
	}
	if err != nil {
		return nil, err
	}
	a, err := parseCA(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if a.leafKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	a.now, a.lru, a.byKey, a.size = now, list.New(), map[string]*list.Element{}, max(cacheSize, 1)
	return a, nil
}

func readCAFiles(dir string) (certPEM, keyPEM []byte, err error) {
	kp := filepath.Join(dir, caKeyFile)
	st, err := os.Stat(kp)
	if err != nil {
		return nil, nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, nil, fmt.Errorf("CA key %s has mode %v, want 0600: %w", kp, st.Mode().Perm(), errdefs.ErrFailedPrecondition)
	}
	if keyPEM, err = os.ReadFile(kp); err != nil {
		return nil, nil, err
	}
	certPEM, err = os.ReadFile(filepath.Join(dir, caCertFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("CA key without certificate in %s: %w", dir, errdefs.ErrFailedPrecondition)
	}
	return certPEM, keyPEM, err
}

func createCA(dir string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "DeltaBox egress CA " + host, Organization: []string{"DeltaBox"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal CA key: %w", err)
	}
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPath, certPath := filepath.Join(dir, caKeyFile), filepath.Join(dir, caCertFile)
	if err := atomicfile.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, fmt.Errorf("write %s: %w", keyPath, err)
	}
	if err := atomicfile.WriteFile(certPath, certPEM, 0o644); err != nil {
		return certPEM, keyPEM, fmt.Errorf("write %s: %w", certPath, err)
	}
	return certPEM, keyPEM, nil
}

func parseCA(certPEM, keyPEM []byte) (*authority, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("CA files are not PEM: %w", errdefs.ErrDataLoss)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w: %w", errdefs.ErrDataLoss, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA key: %w: %w", errdefs.ErrDataLoss, err)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("CA key does not match its certificate: %w", errdefs.ErrDataLoss)
	}
	return &authority{cert: cert, key: key, certPEM: certPEM}, nil
}

// leaf returns a certificate for host (a validated name or IP literal), from the cache if fresh.
func (a *authority) leaf(host string) (*tls.Certificate, error) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.byKey[host]; ok {
		e := el.Value.(*leafEntry)
		if now.Before(e.cert.Leaf.NotAfter.Add(-time.Hour)) {
			a.lru.MoveToFront(el)
			return e.cert, nil
		}
		a.lru.Remove(el)
		delete(a.byKey, host)
	}
	c, err := a.mint(host, now)
	if err != nil {
		return nil, err
	}
	a.byKey[host] = a.lru.PushFront(&leafEntry{host: host, cert: c})
	for a.lru.Len() > a.size {
		old := a.lru.Remove(a.lru.Back()).(*leafEntry)
		delete(a.byKey, old.host)
	}
	return c, nil
}

func (a *authority) mint(host string, now time.Time) (*tls.Certificate, error) {
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     minTime(now.Add(leafTTL), a.cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &a.leafKey.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("mint certificate for %q: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse minted certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: a.leafKey, Leaf: leaf}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n.Add(n, big.NewInt(1))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
