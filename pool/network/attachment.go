package network

import (
	"fmt"
	"net/netip"
)

// Attachment is a sandbox's network identity: what the pool puts into the container spec and
// what the proxy uses to tell sandboxes apart (the source IP).
type Attachment struct {
	ID        string
	NetNSPath string     // the container's network namespace (specs.LinuxNamespace.Path)
	IP        netip.Addr // the sandbox's address on the bridge
	Gateway   netip.Addr // the bridge's address, where the proxy listens
	ProxyURL  string     // http://GATEWAY:PROXYPORT
}

// Env returns the proxy environment for the sandbox's processes. NO_PROXY keeps loopback
// inside the sandbox; everything else goes through the proxy, the only reachable endpoint.
func (a Attachment) Env() []string {
	return []string{
		"HTTP_PROXY=" + a.ProxyURL,
		"HTTPS_PROXY=" + a.ProxyURL,
		"http_proxy=" + a.ProxyURL,
		"https_proxy=" + a.ProxyURL,
		"NO_PROXY=localhost,127.0.0.1",
		"no_proxy=localhost,127.0.0.1",
	}
}

func proxyURL(gw netip.Addr, port uint16) string {
	return fmt.Sprintf("http://%s", netip.AddrPortFrom(gw, port))
}
