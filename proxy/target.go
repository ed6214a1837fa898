package proxy

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// target is where a request goes, derived from untrusted input and validated.
type target struct {
	scheme string
	host   string // lower case name or unmapped IP literal, no brackets
	port   int
	url    *url.URL // absolute URL to forward to
	path   string   // cleaned path, for matching
}

// requestError is a refusal of a malformed or inconsistent request.
type requestError struct {
	status int
	reason string
	cause  error // what made it, if anything
}

func (e *requestError) Error() string { return e.reason }

func reject(status int, format string, args ...any) *requestError {
	return &requestError{status: status, reason: fmt.Sprintf(format, args...)}
}

// targetOf finds and validates the target of r on a connection described by m.
func targetOf(r *http.Request, m *connMeta) (*target, *requestError) {
	switch m.mode {
	case modeForward:
		return forwardTarget(r)
	case modeTunnel:
		return tunnelTarget(r, m)
	default:
		return transparentTarget(r, m)
	}
}

func forwardTarget(r *http.Request) (*target, *requestError) {
	if !r.URL.IsAbs() || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		return nil, reject(http.StatusBadRequest, "forward proxy requests need an absolute http(s) URL")
	}
	if r.URL.User != nil {
		return nil, reject(http.StatusBadRequest, "credentials in the request URL are not allowed")
	}
	host, port, err := splitHostPort(r.URL.Host, defaultPort(r.URL.Scheme))
	if err != nil {
		return nil, reject(http.StatusBadRequest, "bad host: %v", err)
	}
	return newTarget(r.URL.Scheme, host, port, r.URL), nil
}

// tunnelTarget checks that the inner request, the SNI and the CONNECT authority agree.
func tunnelTarget(r *http.Request, m *connMeta) (*target, *requestError) {
	scheme := "http"
	if m.tls {
		scheme = "https"
	}
	if m.sni != "" && normalizeHost(m.sni) != m.host {
		return nil, reject(http.StatusMisdirectedRequest, "TLS server name %q does not match CONNECT authority %q", sanitize(m.sni), m.host)
	}
	host, port, err := splitHostPort(r.Host, m.port)
	if err != nil {
		return nil, reject(http.StatusBadRequest, "bad Host header: %v", err)
	}
	if host != m.host || port != m.port {
		return nil, reject(http.StatusMisdirectedRequest, "Host %q does not match CONNECT authority %s", sanitize(r.Host), net.JoinHostPort(m.host, strconv.Itoa(m.port)))
	}
	if r.URL.IsAbs() && !strings.EqualFold(r.URL.Host, r.Host) {
		return nil, reject(http.StatusMisdirectedRequest, "request URL host does not match the tunnel")
	}
	return newTarget(scheme, host, port, r.URL), nil
}

// transparentTarget takes the host from SNI (TLS) or Host, and the port from the original
// destination.
func transparentTarget(r *http.Request, m *connMeta) (*target, *requestError) {
	scheme, want := "http", ""
	if m.tls {
		scheme, want = "https", m.host
	}
	hostHdr := r.Host
	if hostHdr == "" && !m.tls {
		hostHdr = m.origIP.String()
	}
	host, _, err := splitHostPort(hostHdr, m.port)
	if err != nil {
		return nil, reject(http.StatusBadRequest, "bad Host header: %v", err)
	}
	if want != "" && host != want {
		return nil, reject(http.StatusMisdirectedRequest, "Host %q does not match TLS server name %q", sanitize(r.Host), want)
	}
	return newTarget(scheme, host, m.port, r.URL), nil
}

func newTarget(scheme, host string, port int, u *url.URL) *target {
	hostport := host
	if strings.Contains(host, ":") {
		hostport = "[" + host + "]"
	}
	if port != defaultPort(scheme) {
		hostport = net.JoinHostPort(host, strconv.Itoa(port))
	}
	out := &url.URL{Scheme: scheme, Host: hostport, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
	if out.Path == "" {
		out.Path = "/"
	}
	return &target{scheme: scheme, host: host, port: port, url: out, path: cleanPath(u.Path)}
}

func defaultPort(scheme string) int {
	if scheme == "https" {
		return 443
	}
	return 80
}

// splitHostPort parses "host", "host:port" or "[v6]:port" and validates both parts.
func splitHostPort(hp string, defPort int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(hp)
	if err != nil {
		host, portStr = strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]"), ""
	}
	port := defPort
	if portStr != "" {
		if port, err = strconv.Atoi(portStr); err != nil || port < 1 || port > 65535 {
			return "", 0, fmt.Errorf("bad port %q", sanitize(portStr))
		}
	}
	host = normalizeHost(host)
	if host == "" {
		return "", 0, fmt.Errorf("bad host %q", sanitize(hp))
	}
	return host, port, nil
}

// normalizeHost lower-cases and validates a host name or IP literal; "" if invalid.
func normalizeHost(h string) string {
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.Zone() != "" {
			return ""
		}
		return ip.Unmap().String()
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if !validHostname(h) {
		return ""
	}
	return h
}

// validHostname accepts a lower-case DNS name. A name whose last label is a number (decimal,
// octal or 0x hex) is refused: resolvers read "2130706433", "0x7f.1" or "127.1" as IP
// addresses (inet_aton), and no top-level domain is numeric.
func validHostname(h string) bool {
	if h == "" || len(h) > 253 || numericLabel(h[strings.LastIndexByte(h, '.')+1:]) {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// numericLabel reports whether a label reads as a number to inet_aton.
func numericLabel(l string) bool {
	if rest, ok := strings.CutPrefix(l, "0x"); ok {
		return strings.Trim(rest, "0123456789abcdef") == ""
	}
	return l != "" && strings.Trim(l, "0123456789") == ""
}

// sanitize makes untrusted text safe for a header value or a log line.
func sanitize(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
