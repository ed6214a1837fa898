package network

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	gocni "github.com/containerd/go-cni"
)

// Anti-spoofing binds each sandbox's address to its own bridge port. The egress proxy tells
// sandboxes apart by source address, so a sandbox that sent with another's IP (or answered ARP
// for it) would act in the other's name. Every frame that enters the bridge from a sandbox's
// veth goes through a chain of its own in ebtables' filter table (INPUT: to the host, FORWARD:
// to other ports), which lets through IPv4 from the sandbox's MAC and IP and ARP whose sender
// is that MAC and IP, and drops everything else. ebtables is the nf_tables backend on Debian
// 12 (package iptables); the chains are <PREFIX>-S-<hash of the sandbox ID>.

// portChain names the anti-spoofing chain of sandbox id.
func (f *firewall) portChain(id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return fmt.Sprintf("%s-S-%08x", f.prefix, h.Sum32())
}

// bindPort installs sandbox id's chain for its bridge port veth, address ip and MAC mac, in one
// atomic ebtables-restore (chain, rules and both jumps, or nothing).
func (f *firewall) bindPort(ctx context.Context, id, veth string, ip netip.Addr, mac net.HardwareAddr) error {
	c := f.portChain(id)
	var b strings.Builder
	fmt.Fprintf(&b, "*filter\n:%s RETURN\n", c)
	fmt.Fprintf(&b, "-A %s -p IPv4 -s %s --ip-src %s -j RETURN\n", c, mac, ip)
	fmt.Fprintf(&b, "-A %s -p ARP -s %s --arp-ip-src %s --arp-mac-src %s -j RETURN\n", c, mac, ip, mac)
	fmt.Fprintf(&b, "-A %s -j DROP\n", c)
	for _, hook := range []string{"INPUT", "FORWARD"} {
		fmt.Fprintf(&b, "-I %s 1 -i %s -j %s\n", hook, veth, c)
	}
	b.WriteString("COMMIT\n")
	if _, err := f.run.Run(ctx, []byte(b.String()), "ebtables-restore", "--noflush"); err != nil {
		return fmt.Errorf("bind %s to port %s (ebtables): %w", ip, veth, err)
	}
	return nil
}

// unbindPorts removes the anti-spoofing chains (and the jumps into them) of the sandboxes
// whose chain name match accepts; chains already gone are fine.
func (f *firewall) unbindPorts(ctx context.Context, match func(chain string) bool) error {
	out, err := f.run.Run(ctx, nil, "ebtables", "-t", "filter", "-L")
	if err != nil {
		return fmt.Errorf("list ebtables filter table: %w", err)
	}
	var b strings.Builder
	chains := map[string]bool{}
	hook := ""
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(line, "Bridge chain: "); ok {
			hook, _, _ = strings.Cut(name, ",")
			if strings.HasPrefix(hook, f.prefix+"-S-") && match(hook) {
				chains[hook] = true
			}
			continue
		}
		rule := strings.TrimSpace(line)
		target := rule[strings.LastIndex(rule, " ")+1:]
		if (hook == "INPUT" || hook == "FORWARD") && strings.HasPrefix(target, f.prefix+"-S-") && match(target) {
			fmt.Fprintf(&b, "-D %s %s\n", hook, rule)
		}
	}
	for c := range chains {
		fmt.Fprintf(&b, "-F %s\n-X %s\n", c, c)
	}
	if b.Len() == 0 {
		return nil
	}
	if _, err := f.run.Run(ctx, []byte("*filter\n"+b.String()+"COMMIT\n"), "ebtables-restore", "--noflush"); err != nil {
		return fmt.Errorf("remove anti-spoofing chains: %w", err)
	}
	return nil
}

// unbindPort removes sandbox id's anti-spoofing chain.
func (f *firewall) unbindPort(ctx context.Context, id string) error {
	c := f.portChain(id)
	return f.unbindPorts(ctx, func(chain string) bool { return chain == c })
}

// sandboxPort returns the host end of the sandbox's veth (a port of bridge) and the MAC of its
// end in the sandbox, from a CNI result.
func sandboxPort(res *gocni.Result, bridge string) (string, net.HardwareAddr, error) {
	var veth string
	var mac net.HardwareAddr
	for name, cfg := range res.Interfaces {
		if cfg.Sandbox != "" {
			if m, err := net.ParseMAC(cfg.Mac); err == nil && name == "eth0" {
				mac = m
			}
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/class/net", bridge, "brif", name)); err == nil {
			veth = name
		}
	}
	if veth == "" || mac == nil {
		return "", nil, fmt.Errorf("CNI result names no port of %s with a sandbox MAC (%v): %w", bridge, res.Interfaces, errdefs.ErrFailedPrecondition)
	}
	return veth, mac, nil
}
