// Package snapsign signs and verifies L3 snapshot manifests with Ed25519. A node signs every
// manifest it pushes with its own key; a restore verifies the signature against a set of
// trusted public keys (the node's own and those the configuration names) before it fetches
// or uses anything the manifest points at. It knows nothing of object stores or snapshots
// beyond the bytes it is given and the snapshot's name, and holds no global state.
package snapsign

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
)

// Algorithm names the signature scheme in a Signature document.
const Algorithm = "ed25519"

// InlinePrefix starts an inline public key in a trusted-keys list: "ed25519:" followed by the
// standard base64 of the 32-byte key.
const InlinePrefix = "ed25519:"

// Signature is the detached signature document stored beside a manifest.
type Signature struct {
	Algorithm string `json:"algorithm"`  // "ed25519"
	Key       string `json:"key"`        // fingerprint of the signing key
	Signature string `json:"signature"`  // standard base64 of the 64-byte signature
	PublicKey string `json:"public_key"` // the signer's public key (inline form), for the record only
}

// Fingerprint names a public key: "SHA256:" and the unpadded base64 of its SHA-256.
func Fingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// Inline is the trusted-keys form of pub: "ed25519:BASE64".
func Inline(pub ed25519.PublicKey) string {
	return InlinePrefix + base64.StdEncoding.EncodeToString(pub)
}

// message is what is signed: a domain prefix, the snapshot's name and the manifest's exact
// bytes, so a signature can be used neither for another purpose nor under another name.
func message(name string, manifest []byte) []byte {
	m := make([]byte, 0, len(manifest)+len(name)+40)
	m = append(m, "deltabox-snapshot-manifest-v1\x00"...)
	m = append(m, name...)
	m = append(m, 0)
	return append(m, manifest...)
}

// Signer signs manifests with one private key.
type Signer struct {
	key ed25519.PrivateKey
}

// Public returns the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign returns the encoded signature document for the manifest bytes of snapshot name.
func (s *Signer) Sign(name string, manifest []byte) ([]byte, error) {
	sig := ed25519.Sign(s.key, message(name, manifest))
	return json.Marshal(Signature{Algorithm: Algorithm, Key: Fingerprint(s.Public()),
		Signature: base64.StdEncoding.EncodeToString(sig), PublicKey: Inline(s.Public())})
}

// NewSigner wraps a private key (tests and tools).
func NewSigner(key ed25519.PrivateKey) *Signer { return &Signer{key: key} }

// LoadOrCreate reads the PEM (PKCS#8) Ed25519 private key at path, or creates one there
// (mode 0600, its directory 0700) when there is none, and writes its public key beside it
// as path + ".pub" (PEM, PKIX) for other nodes to trust.
func LoadOrCreate(path string) (*Signer, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return create(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot signing key: %w", err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot signing key: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("snapshot signing key %s has mode %o: want it readable by its owner only (0600): %w",
			path, info.Mode().Perm(), errdefs.ErrFailedPrecondition)
	}
	key, err := parsePrivate(data)
	if err != nil {
		return nil, fmt.Errorf("snapshot signing key %s: %w", path, err)
	}
	s := &Signer{key: key}
	return s, writePublic(path+".pub", s.Public())
}

func create(path string) (*Signer, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate snapshot signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("snapshot signing key: %w", err)
	}
	if err := atomicfile.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, fmt.Errorf("write snapshot signing key: %w", err)
	}
	s := &Signer{key: key}
	return s, writePublic(path+".pub", s.Public())
}

func parsePrivate(data []byte) (ed25519.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("not a PEM PRIVATE KEY block: %w", errdefs.ErrInvalidArgument)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, want an Ed25519 key: %w", k, errdefs.ErrInvalidArgument)
	}
	return key, nil
}

// MarshalPublic encodes pub as a PEM PUBLIC KEY (PKIX) block.
func MarshalPublic(pub ed25519.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(pub) // cannot fail for an Ed25519 key
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func writePublic(path string, pub ed25519.PublicKey) error {
	want := MarshalPublic(pub)
	if cur, err := os.ReadFile(path); err == nil && string(cur) == string(want) {
		return nil
	}
	if err := atomicfile.WriteFile(path, want, 0o644); err != nil {
		return fmt.Errorf("write snapshot public key: %w", err)
	}
	return nil
}

// Verifier holds the trusted public keys, by fingerprint.
type Verifier struct {
	keys map[string]ed25519.PublicKey
}

// NewVerifier trusts the given keys.
func NewVerifier(keys ...ed25519.PublicKey) *Verifier {
	v := &Verifier{keys: map[string]ed25519.PublicKey{}}
	for _, k := range keys {
		v.keys[Fingerprint(k)] = k
	}
	return v
}

// Trusted lists the fingerprints of the trusted keys, sorted.
func (v *Verifier) Trusted() []string {
	out := make([]string, 0, len(v.keys))
	for fp := range v.keys {
		out = append(out, fp)
	}
	sort.Strings(out)
	return out
}

// ParseTrusted reads a trusted-keys list: each entry is an inline key ("ed25519:BASE64") or
// the path of a file holding one or more PEM PUBLIC KEY blocks or inline keys (one a line;
// blank lines and lines starting with # are skipped). An entry that yields no key is an error
// naming it.
func ParseTrusted(entries []string) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, InlinePrefix) {
			k, err := parseInline(e)
			if err != nil {
				return nil, fmt.Errorf("trusted key %q: %w", e, err)
			}
			out = append(out, k)
			continue
		}
		keys, err := readKeyFile(e)
		if err != nil {
			return nil, fmt.Errorf("trusted keys file %q: %w", e, err)
		}
		out = append(out, keys...)
	}
	return out, nil
}

func parseInline(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, InlinePrefix))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("want %s and the base64 of a %d-byte key: %w", InlinePrefix, ed25519.PublicKeySize, errdefs.ErrInvalidArgument)
	}
	return ed25519.PublicKey(b), nil
}

func readKeyFile(path string) ([]ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	var out []ed25519.PublicKey
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("PEM block %q: want PUBLIC KEY: %w", b.Type, errdefs.ErrInvalidArgument)
		}
		k, err := x509.ParsePKIXPublicKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("a %T key, want Ed25519: %w", k, errdefs.ErrInvalidArgument)
		}
		out = append(out, pub)
	}
	for _, line := range strings.Split(string(rest), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := parseInline(line)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no public key in it: %w", errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// Verify checks the signature document sig over the manifest bytes of snapshot name. A
// missing signature (sig empty) is errdefs.ErrFailedPrecondition; a key that is not trusted,
// or a signature that does not verify, is errdefs.ErrPermissionDenied. Errors name the key's
// fingerprint. It returns the fingerprint of the key that signed.
func (v *Verifier) Verify(name string, manifest, sig []byte) (string, error) {
	if len(sig) == 0 {
		return "", fmt.Errorf("snapshot %q is not signed: only signed snapshots are restored: %w", name, errdefs.ErrFailedPrecondition)
	}
	var s Signature
	if err := json.Unmarshal(sig, &s); err != nil || s.Algorithm != Algorithm {
		return "", fmt.Errorf("snapshot %q: signature is not an %s signature document: %w", name, Algorithm, errdefs.ErrPermissionDenied)
	}
	pub, ok := v.keys[s.Key]
	if !ok {
		return s.Key, fmt.Errorf("snapshot %q is signed by key %s, which this node does not trust (trusted: %s; add it to [snapshots] trusted_keys): %w",
			name, s.Key, strings.Join(v.Trusted(), ", "), errdefs.ErrPermissionDenied)
	}
	raw, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil || !ed25519.Verify(pub, message(name, manifest), raw) {
		return s.Key, fmt.Errorf("snapshot %q: the signature by key %s does not match the manifest (changed after signing?): %w",
			name, s.Key, errdefs.ErrPermissionDenied)
	}
	return s.Key, nil
}
