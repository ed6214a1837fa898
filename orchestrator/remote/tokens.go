// Package remote serves the host API on TCP for remote clients: always over TLS (a configured
// certificate, or a self-signed one made once and kept under the state root), and every request
// must carry a bearer token from a tokens file that is re-read when it changes (so tokens
// rotate without a restart). Client certificates (mTLS) can be required on top.
package remote

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// minTokenLen is the shortest token a tokens file may hold.
const minTokenLen = 16

// Tokens is the set of accepted bearer tokens, read from a file and read again when the file
// changes (its inode, size or modification time).
type Tokens struct {
	path string

	mu     sync.Mutex
	stamp  fileStamp
	hashes [][32]byte
	// checked is when the file was last stat'ed: at most one stat per interval.
	checked time.Time
	// failing is the error of the last read, while the file stays unusable (reported once).
	failing string
}

type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

// statInterval bounds how often a busy listener stats the tokens file.
const statInterval = 100 * time.Millisecond

// LoadTokens reads the tokens file at path; an unreadable file or one with no token is an error.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	st, err := stamp(path)
	if err != nil {
		return nil, err
	}
	hashes, err := readTokens(path)
	if err != nil {
		return nil, err
	}
	t.stamp, t.hashes, t.checked = st, hashes, time.Now()
	return t, nil
}

// Len is the number of accepted tokens.
func (t *Tokens) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.hashes)
}

// Valid reports whether token is one of the accepted tokens (in time independent of which, or
// of how much of it matches). A changed file is read again first; a changed file that cannot be
// read, or holds no token, accepts nothing until it is fixed, and reload says why (once per
// distinct failure, not on every request).
func (t *Tokens) Valid(token string) (ok bool, reload error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	reload = t.refresh()
	if token == "" {
		return false, reload
	}
	sum := sha256.Sum256([]byte(token))
	found := 0
	for _, h := range t.hashes {
		found |= subtle.ConstantTimeCompare(sum[:], h[:])
	}
	return found == 1, reload
}

// refresh reads the file again if it changed since the last read.
func (t *Tokens) refresh() error {
	now := time.Now()
	if now.Sub(t.checked) < statInterval {
		return nil
	}
	t.checked = now
	st, err := stamp(t.path)
	if err == nil && st == t.stamp {
		return nil
	}
	if err == nil {
		var hashes [][32]byte
		if hashes, err = readTokens(t.path); err == nil {
			t.stamp, t.hashes, t.failing = st, hashes, ""
			return nil
		}
	}
	// Fail closed: a tokens file that went bad accepts nothing (a revoked token must not
	// live on because the file that revoked it has a typo).
	t.stamp, t.hashes = fileStamp{}, nil
	if err.Error() == t.failing {
		return nil
	}
	t.failing = err.Error()
	return err
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, fmt.Errorf("api tokens file: %w", err)
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(s.Ino)
	}
	return st, nil
}

// readTokens reads a tokens file: one token a line; blank lines and lines starting with '#'
// are skipped. Only the tokens' SHA-256 stay in memory.
func readTokens(path string) ([][32]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("api tokens file: %w", err)
	}
	defer f.Close()
	var hashes [][32]byte
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < minTokenLen || strings.ContainsAny(line, " \t") {
			return nil, fmt.Errorf("api tokens file %s line %d: a token is one word of at least %d characters: %w", path, n, minTokenLen, errdefs.ErrInvalidArgument)
		}
		hashes = append(hashes, sha256.Sum256([]byte(line)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("api tokens file %s: %w", path, err)
	}
	if len(hashes) == 0 {
		return nil, fmt.Errorf("api tokens file %s holds no token: %w", path, errdefs.ErrInvalidArgument)
	}
	return hashes, nil
}
