package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/containerd/errdefs"
)

// Destinations. The proxy dials only global unicast addresses that are not the node's own,
// unless the rule that matched names the request's host exactly (decision.explicit). A name is
// resolved once per request; the addresses that pass are pinned in the request's context and
// the upstream dial uses only them (dialPinned), so DNS cannot change between the check and
// the dial. Held effects sent at commit and compensating requests are checked the same way when
// they are sent (sendOnce).

// reservedRange is a block of addresses that is not a global unicast destination.
type reservedRange struct {
	prefix netip.Prefix
	why    string
}

func ranges(pairs ...string) []reservedRange {
	out := make([]reservedRange, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, reservedRange{netip.MustParsePrefix(pairs[i]), pairs[i+1]})
	}
	return out
}

// reserved4 and reserved6 follow the IANA special-purpose address registries; the first
// match gives the reason, so more specific blocks come first.
var (
	reserved4 = ranges(
		"255.255.255.255/32", "broadcast",
		"0.0.0.0/8", "this-network",
		"10.0.0.0/8", "private",
		"100.64.0.0/10", "shared (carrier-grade NAT)",
		"127.0.0.0/8", "loopback",
		"169.254.0.0/16", "link-local",
		"172.16.0.0/12", "private",
		"192.0.0.0/24", "IETF protocol assignment",
		"192.0.2.0/24", "documentation",
		"192.88.99.0/24", "6to4 relay anycast",
		"192.168.0.0/16", "private",
		"198.18.0.0/15", "benchmarking",
		"198.51.100.0/24", "documentation",
		"203.0.113.0/24", "documentation",
		"224.0.0.0/4", "multicast",
		"240.0.0.0/4", "reserved",
	)
	reserved6 = ranges(
		"::/128", "unspecified",
		"::1/128", "loopback",
		"::/96", "IPv4-compatible",
		"::ffff:0:0/96", "IPv4-mapped",
		"::ffff:0:0:0/96", "IPv4-translated",
		"64:ff9b:1::/48", "local-use NAT64",
		"100::/64", "discard-only",
		"2001::/32", "Teredo",
		"2001::/23", "IETF protocol assignment",
		"2001:db8::/32", "documentation",
		"3fff::/20", "documentation",
		"5f00::/16", "SRv6 segment identifier",
		"fc00::/7", "private (unique local)",
		"fe80::/10", "link-local",
		"fec0::/10", "site-local",
		"ff00::/8", "multicast",
	)
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	nat64          = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour      = netip.MustParsePrefix("2002::/16")
)

// blockedReason says why a is not a global unicast destination, or "" if it is one. IPv6
// forms that embed an IPv4 address (NAT64, 6to4) are judged by the address they embed.
func blockedReason(a netip.Addr) string {
	a = a.Unmap()
	if a.Is4() {
		return rangeReason(reserved4, a)
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return embeddedReason("NAT64", netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(a):
		return embeddedReason("6to4", netip.AddrFrom4([4]byte(b[2:6])))
	}
	if r := rangeReason(reserved6, a); r != "" {
		return r
	}
	if !globalUnicast6.Contains(a) {
		return "reserved"
	}
	return ""
}

func rangeReason(rs []reservedRange, a netip.Addr) string {
	for _, r := range rs {
		if r.prefix.Contains(a) {
			return r.why
		}
	}
	return ""
}

func embeddedReason(form string, v4 netip.Addr) string {
	if r := blockedReason(v4); r != "" {
		return fmt.Sprintf("%s form of %s (%s)", form, v4, r)
	}
	return ""
}

// NodeAddrsFunc lists the node's own interface addresses with their prefix lengths.
type NodeAddrsFunc func() ([]netip.Prefix, error)

// localReason says why a is the node itself (an interface address, the directed broadcast of
// an interface's IPv4 network, or the sandbox gateway), or "" if it is not. The interfaces are
// listed at every check, so an address added after the proxy started is refused too.
func (p *Proxy) localReason(a netip.Addr) (string, error) {
	for _, g := range p.cfg.gateways {
		if g == a {
			return "the sandbox gateway", nil
		}
	}
	prefixes, err := p.cfg.nodeAddrs()
	if err != nil {
		return "", fmt.Errorf("list this node's addresses: %w: %w", errdefs.ErrUnavailable, err)
	}
	for _, pfx := range prefixes {
		switch {
		case pfx.Addr().Unmap() == a:
			return "an address of this node", nil
		case a.Is4() && pfx.Addr().Is4() && pfx.Bits() < 31 && broadcast4(pfx) == a:
			return "the broadcast address of a network of this node", nil
		}
	}
	return "", nil
}

// broadcast4 is the last address of an IPv4 prefix.
func broadcast4(pfx netip.Prefix) netip.Addr {
	b := pfx.Masked().Addr().As4()
	host := uint32(1)<<(32-pfx.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// refusal says why the proxy may not dial a without a rule naming its host, or "".
func (p *Proxy) refusal(a netip.Addr) (string, error) {
	if r := blockedReason(a); r != "" {
		return r, nil
	}
	return p.localReason(a)
}

// resolve returns the addresses of host the proxy may dial: global ones that are not the
// node's own, and any address only if explicit (a rule names the host). The caller dials only
// these (withPinned, dialPinned): no second lookup.
func (p *Proxy) resolve(ctx context.Context, host string, explicit bool) ([]netip.Addr, error) {
	addrs, err := p.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var ok []netip.Addr
	why := ""
	for _, a := range addrs {
		a = a.Unmap()
		if !explicit {
			r, err := p.refusal(a)
			if err != nil {
				return nil, err
			}
			if r != "" {
				why = fmt.Sprintf("destination %s (%s) is %s; only a rule naming it may allow it", a, host, r)
				continue
			}
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

// HostName is the name every sandbox reaches the host by, through the proxy: it resolves to
// the sandbox network's gateway (WithGateway), which the proxy dials only for a rule naming
// HostName (or the address) exactly, like any address of the node.
const HostName = "host.deltabox.internal"

// lookup resolves host once; an IP literal is its own answer.
func (p *Proxy) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	if host == HostName {
		if len(p.cfg.gateways) == 0 {
			return nil, fmt.Errorf("%s: this node has no sandbox network gateway: %w", host, errdefs.ErrUnavailable)
		}
		return p.cfg.gateways, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := p.cfg.resolver.LookupNetIP(lctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w: %w", host, errdefs.ErrUnavailable, err)
	}
	return addrs, nil
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
