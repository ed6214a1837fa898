package state

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// errPathNotFound marks a pointer that is well formed but names no value in the document.
var errPathNotFound = errors.New("path not found")

// pointer is a parsed RFC 6901 JSON pointer: its reference tokens, unescaped. The empty
// pointer (no tokens) names the whole document.
type pointer []string

// parsePointer parses s, which must be "" or start with "/". "~1" decodes to "/" and "~0" to
// "~" (in that order, so "~01" is "~1"); any other "~" sequence is an error.
func parsePointer(s string) (pointer, error) {
	if s == "" {
		return pointer{}, nil
	}
	if s[0] != '/' {
		return nil, fmt.Errorf("pointer %q must be empty or start with \"/\"", s)
	}
	toks := strings.Split(s[1:], "/")
	for i, t := range toks {
		if !strings.Contains(t, "~") {
			continue
		}
		u, err := unescapeToken(t)
		if err != nil {
			return nil, fmt.Errorf("pointer %q: %w", s, err)
		}
		toks[i] = u
	}
	return toks, nil
}

func unescapeToken(t string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		if t[i] != '~' {
			b.WriteByte(t[i])
			continue
		}
		if i+1 >= len(t) || (t[i+1] != '0' && t[i+1] != '1') {
			return "", fmt.Errorf("bad escape in token %q (only ~0 and ~1 are allowed)", t)
		}
		if t[i+1] == '0' {
			b.WriteByte('~')
		} else {
			b.WriteByte('/')
		}
		i++
	}
	return b.String(), nil
}

var tokenEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// String formats p back into RFC 6901 syntax.
func (p pointer) String() string {
	var b strings.Builder
	for _, t := range p {
		b.WriteByte('/')
		b.WriteString(tokenEscaper.Replace(t))
	}
	return b.String()
}

// parent returns p without its last token; p must not be the root.
func (p pointer) parent() pointer { return p[:len(p)-1] }

// last returns p's last token; p must not be the root.
func (p pointer) last() string { return p[len(p)-1] }

// child returns a new pointer with tok appended to p.
func (p pointer) child(tok string) pointer {
	c := make(pointer, len(p)+1)
	copy(c, p)
	c[len(p)] = tok
	return c
}

// equal reports whether p and q name the same location.
func (p pointer) equal(q pointer) bool {
	if len(p) != len(q) {
		return false
	}
	for i := range p {
		if p[i] != q[i] {
			return false
		}
	}
	return true
}

// properPrefixOf reports whether p names a proper ancestor of q.
func (p pointer) properPrefixOf(q pointer) bool {
	return len(p) < len(q) && p.equal(q[:len(p)])
}

// arrayIndex resolves tok against an array of length n. RFC 6901 indexes are "0" or a decimal
// without leading zeros; "-" names the position after the last element and is accepted only
// when insert is true (add), as is an index equal to n. A syntactically bad index is an
// invalid pointer; an index out of range is errPathNotFound.
func arrayIndex(tok string, n int, insert bool) (int, error) {
	if tok == "-" {
		if insert {
			return n, nil
		}
		return 0, fmt.Errorf("array index \"-\" (past the end): %w", errPathNotFound)
	}
	if tok == "" || (len(tok) > 1 && tok[0] == '0') || strings.TrimLeft(tok, "0123456789") != "" {
		return 0, fmt.Errorf("bad array index %q", tok)
	}
	i, err := strconv.Atoi(tok)
	if err != nil || i > n || (i == n && !insert) {
		return 0, fmt.Errorf("array index %s out of range (length %d): %w", tok, n, errPathNotFound)
	}
	return i, nil
}
