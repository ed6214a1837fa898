package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	gocni "github.com/containerd/go-cni"
)

// bridge is the host bridge all sandbox veths attach to. It carries the gateway address,
// has no IPv6 and a fixed MAC (derived from the gateway IP, like CNI's bridge plugin does) so
// sandboxes' ARP entries stay valid while veths with lower MACs come and go.
type bridge struct {
	run     Runner
	name    string
	gateway netip.Prefix // gateway address with the subnet's length
}

// ensure creates the bridge if needed and gives it the gateway address; idempotent.
func (b *bridge) ensure(ctx context.Context) error {
	if _, err := net.InterfaceByName(b.name); err != nil {
		if err := b.ip(ctx, "link", "add", "name", b.name, "type", "bridge"); err != nil {
			return err
		}
	}
	if err := writeSysctl("/proc/sys/net/ipv6/conf/"+b.name+"/disable_ipv6", "1"); err != nil {
		return err
	}
	if err := b.ip(ctx, "link", "set", "dev", b.name, "address", b.mac()); err != nil {
		return err
	}
	ok, err := b.hasOnlyGateway()
	if err != nil {
		return err
	}
	if !ok {
		if err := b.ip(ctx, "addr", "flush", "dev", b.name); err != nil {
			return err
		}
		if err := b.ip(ctx, "addr", "add", b.gateway.String(), "dev", b.name); err != nil {
			return err
		}
	}
	return b.ip(ctx, "link", "set", "dev", b.name, "up")
}

// mac returns 0a:58 followed by the gateway's four bytes (a locally administered address).
func (b *bridge) mac() string {
	a := b.gateway.Addr().As4()
	return fmt.Sprintf("0a:58:%02x:%02x:%02x:%02x", a[0], a[1], a[2], a[3])
}

// hasOnlyGateway reports whether the bridge's one IPv4 address is the gateway.
func (b *bridge) hasOnlyGateway() (bool, error) {
	ifi, err := net.InterfaceByName(b.name)
	if err != nil {
		return false, fmt.Errorf("bridge %s: %w", b.name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return false, fmt.Errorf("bridge %s addresses: %w", b.name, err)
	}
	var v4 []string
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			v4 = append(v4, p.String())
		}
	}
	return len(v4) == 1 && v4[0] == b.gateway.String(), nil
}

// remove deletes the bridge; a missing one is fine.
func (b *bridge) remove(ctx context.Context) error {
	if _, err := net.InterfaceByName(b.name); err != nil {
		return nil
	}
	return b.ip(ctx, "link", "del", "dev", b.name)
}

func (b *bridge) ip(ctx context.Context, args ...string) error {
	if _, err := b.run.Run(ctx, nil, "ip", args...); err != nil {
		return fmt.Errorf("configure bridge %s: %w", b.name, err)
	}
	return nil
}

// writeSysctl writes a /proc/sys file; a missing one (IPv6 compiled out) is fine.
func writeSysctl(path, value string) error {
	err := os.WriteFile(path, []byte(value), 0o644)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sysctl %s=%s: %w", path, value, err)
	}
	return nil
}

// isolatePorts marks the sandbox's bridge port (the host end of its veth) isolated, so the
// kernel forwards no frames between sandboxes. CNI's bridge plugin does this too
// (portIsolation, plugins >= v1.5); this also covers an older plugin that ignores the key.
func (b *bridge) isolatePorts(res *gocni.Result) error {
	for name, cfg := range res.Interfaces {
		if cfg.Sandbox != "" {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/class/net", b.name, "brif", name)); err != nil {
			continue // not a port of our bridge
		}
		p := filepath.Join("/sys/class/net", name, "brport", "isolated")
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("isolate bridge port %s: %w", name, err)
		}
	}
	return nil
}
