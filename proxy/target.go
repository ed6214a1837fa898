package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
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

func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
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

// blockedPrefixes are destinations a sandbox reaches only through a rule naming them.
var blockedPrefixes = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/3",
		"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// blockedReason says why a is not a public destination, or "" if it is.
func blockedReason(a netip.Addr) string {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		return blockedReason(netip.AddrFrom4([4]byte(b[12:])))
	}
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsPrivate():
		return "private"
	}
	for _, p := range blockedPrefixes {
		if p.Contains(a) {
			return "non-public"
		}
	}
	return ""
}

// resolve returns the addresses of host the proxy may dial: all public ones, and non-public
// ones only if explicit (a rule names the host). The caller dials only these (no rebinding).
func (p *Proxy) resolve(ctx context.Context, host string, explicit bool) ([]netip.Addr, error) {
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if addrs, err = p.cfg.resolver.LookupNetIP(lctx, "ip", host); err != nil {
			return nil, fmt.Errorf("resolve %s: %w: %w", host, errdefs.ErrUnavailable, err)
		}
	}
	var ok []netip.Addr
	why := ""
	for _, a := range addrs {
		a = a.Unmap()
		if r := blockedReason(a); r != "" && !explicit {
			why = fmt.Sprintf("destination %s (%s) is %s; only a rule naming it may allow it", a, host, r)
			continue
		}
		ok = append(ok, a)
	}
	if len(ok) == 0 {
		if why == "" {
			why = "no addresses for " + host
		}
		return nil, fmt.Errorf("%s: %w", why, errdefs.ErrPermissionDenied)
	}
	return ok, nil
}

type pinKey struct{}

// withPinned carries the checked addresses for the upstream dial.
func withPinned(ctx context.Context, addrs []netip.Addr) context.Context {
	return context.WithValue(ctx, pinKey{}, addrs)
}

// dialPinned dials only addresses checked by resolve for this request; the host name in addr
// is ignored, so DNS cannot change between the check and the dial.
func (p *Proxy) dialPinned(ctx context.Context, network, addr string) (net.Conn, error) {
	addrs, _ := ctx.Value(pinKey{}).([]netip.Addr)
	_, port, err := net.SplitHostPort(addr)
	if err != nil || len(addrs) == 0 {
		return nil, fmt.Errorf("dial %s without a checked address: %w", addr, errdefs.ErrPermissionDenied)
	}
	var lastErr error
	for _, a := range addrs {
		c, err := p.cfg.dialer.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}
