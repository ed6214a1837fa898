package network

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/deltabox/deltabox/internal/log"
)

// linkLocal is never redirected to the proxy: instance metadata services live there.
var linkLocal = netip.MustParsePrefix("169.254.0.0/16")

// firewall is DeltaBox's host firewall for one bridge, in iptables (nf_tables backend on
// Debian 12). It owns the chains <PREFIX>-INPUT and <PREFIX>-FORWARD (filter, IPv4 and IPv6)
// and <PREFIX>-PREROUTING (nat, IPv4), and one jump per hook from the host's built-in chain,
// matched on the bridge so it never sees other traffic. Chains are (re)written atomically
// with iptables-restore --noflush, which replaces only the chains it declares.
type firewall struct {
	run     Runner
	bridge  string
	prefix  string // chain name prefix, e.g. DELTABOX
	subnet  netip.Prefix
	gateway netip.Addr
	proxy   uint16
	http    uint16
	https   uint16
	ipv6    bool // manage ip6tables too
}

// chainRef names one of our chains.
type chainRef struct{ tool, table, name string }

// jump is one rule in a built-in chain (hook) that sends the bridge's traffic to our chain.
type jump struct {
	to    chainRef
	hook  string
	match []string
}

func (j jump) rule() []string { return append(slices.Clone(j.match), "-j", j.to.name) }

// spec is the jump as `iptables -S` prints it.
func (j jump) spec() string { return "-A " + j.hook + " " + strings.Join(j.rule(), " ") }

func (f *firewall) chain(hook string) string { return f.prefix + "-" + hook }

// rules4 returns the iptables-restore input for IPv4.
func (f *firewall) rules4() string {
	in, fwd, pre := f.chain("INPUT"), f.chain("FORWARD"), f.chain("PREROUTING")
	var b strings.Builder
	fmt.Fprintf(&b, "*filter\n:%s - [0:0]\n:%s - [0:0]\n", in, fwd)
	fmt.Fprintf(&b, "-A %s -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n", in)
	for _, port := range f.ports() {
		fmt.Fprintf(&b, "-A %s -s %s -d %s/32 -p tcp -m tcp --dport %d -j ACCEPT\n", in, f.subnet, f.gateway, port)
	}
	fmt.Fprintf(&b, "-A %s -j DROP\n-A %s -j DROP\nCOMMIT\n", in, fwd)
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n-A %s -d %s -j RETURN\n", pre, pre, linkLocal)
	for _, r := range [][2]uint16{{80, f.http}, {443, f.https}} {
		if r[1] != 0 {
			fmt.Fprintf(&b, "-A %s -p tcp -m tcp --dport %d -j DNAT --to-destination %s:%d\n", pre, r[0], f.gateway, r[1])
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// rules6 returns the ip6tables-restore input: sandboxes have no IPv6, so all of it is dropped.
func (f *firewall) rules6() string {
	in, fwd := f.chain("INPUT"), f.chain("FORWARD")
	return fmt.Sprintf("*filter\n:%s - [0:0]\n:%s - [0:0]\n-A %s -j DROP\n-A %s -j DROP\nCOMMIT\n", in, fwd, in, fwd)
}

// ports returns the gateway ports a sandbox may open connections to.
func (f *firewall) ports() []uint16 {
	var ports []uint16
	for _, p := range []uint16{f.proxy, f.http, f.https} {
		if p != 0 && !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports
}

// chains returns our chains, in the order the jumps into them are inserted.
func (f *firewall) chains() []chainRef {
	cs := []chainRef{
		{"iptables", "filter", f.chain("INPUT")},
		{"iptables", "filter", f.chain("FORWARD")},
		{"iptables", "nat", f.chain("PREROUTING")},
	}
	if f.ipv6 {
		cs = append(cs, chainRef{"ip6tables", "filter", f.chain("INPUT")}, chainRef{"ip6tables", "filter", f.chain("FORWARD")})
	}
	return cs
}

// jumps returns the rules that hook our chains into the host's built-in chains: everything
// that enters or leaves through the bridge, nothing else.
func (f *firewall) jumps() []jump {
	var js []jump
	for _, c := range f.chains() {
		hook := strings.TrimPrefix(c.name, f.prefix+"-")
		js = append(js, jump{c, hook, []string{"-i", f.bridge}})
		if hook == "FORWARD" {
			js = append(js, jump{c, hook, []string{"-o", f.bridge}})
		}
	}
	return js
}

// ensure writes our chains and makes our jumps the first rules of their built-in chains. It
// is idempotent and never changes a built-in chain's policy or anyone else's rules.
func (f *firewall) ensure(ctx context.Context) error {
	if err := f.restore(ctx, "iptables-restore", f.rules4()); err != nil {
		return err
	}
	if f.ipv6 {
		if err := f.restore(ctx, "ip6tables-restore", f.rules6()); err != nil {
			return err
		}
	}
	for _, js := range f.jumpsByHook() {
		if err := f.ensureFirst(ctx, js); err != nil {
			return err
		}
	}
	log.L(ctx).Debug("network firewall in place", "bridge", f.bridge, "chains", f.prefix+"-*")
	return nil
}

func (f *firewall) restore(ctx context.Context, tool, rules string) error {
	if _, err := f.run.Run(ctx, []byte(rules), tool, "-w", "--noflush"); err != nil {
		return fmt.Errorf("install %s firewall chains: %w", f.prefix, err)
	}
	return nil
}

// jumpsByHook groups the jumps by the built-in chain they live in, in insertion order.
func (f *firewall) jumpsByHook() [][]jump {
	var groups [][]jump
	for _, j := range f.jumps() {
		if n := len(groups); n > 0 && groups[n-1][0].to.tool == j.to.tool && groups[n-1][0].to.table == j.to.table && groups[n-1][0].hook == j.hook {
			groups[n-1] = append(groups[n-1], j)
			continue
		}
		groups = append(groups, []jump{j})
	}
	return groups
}

// ensureFirst makes js (jumps into one built-in chain) that chain's first rules, so an ACCEPT
// someone inserts later at the top cannot bypass them. Jumps already first are left alone.
func (f *firewall) ensureFirst(ctx context.Context, js []jump) error {
	j0 := js[0]
	out, err := f.run.Run(ctx, nil, j0.to.tool, "-w", "-t", j0.to.table, "-S", j0.hook)
	if err != nil {
		return fmt.Errorf("list %s %s/%s: %w", j0.to.tool, j0.to.table, j0.hook, err)
	}
	if jumpsFirst(string(out), js) {
		return nil
	}
	for _, j := range js {
		if err := f.removeJump(ctx, j); err != nil {
			return fmt.Errorf("move jump %s -> %s: %w", j.hook, j.to.name, err)
		}
	}
	for i := len(js) - 1; i >= 0; i-- {
		j := js[i]
		args := append([]string{"-w", "-t", j.to.table, "-I", j.hook, "1"}, j.rule()...)
		if _, err := f.run.Run(ctx, nil, j.to.tool, args...); err != nil {
			return fmt.Errorf("insert jump %s -> %s: %w", j.hook, j.to.name, err)
		}
	}
	log.L(ctx).Info("network firewall jumps (re)inserted first", "tool", j0.to.tool, "table", j0.to.table, "chain", j0.hook)
	return nil
}

// jumpsFirst reports whether an `iptables -S CHAIN` listing starts with exactly js.
func jumpsFirst(listing string, js []jump) bool {
	var rules []string
	for _, line := range strings.Split(listing, "\n") {
		if strings.HasPrefix(line, "-A ") {
			rules = append(rules, strings.TrimSpace(line))
		}
	}
	if len(rules) < len(js) {
		return false
	}
	for i, j := range js {
		if rules[i] != j.spec() {
			return false
		}
	}
	return true
}

// remove deletes our jumps and chains; pieces already gone are fine.
func (f *firewall) remove(ctx context.Context) error {
	if err := f.unbindPorts(ctx, func(string) bool { return true }); err != nil {
		return err
	}
	for _, c := range f.chains() {
		if err := f.removeChain(ctx, c); err != nil {
			return fmt.Errorf("remove %s/%s: %w", c.table, c.name, err)
		}
	}
	return nil
}

// removeChain deletes the jumps into c, then c itself, when c exists.
func (f *firewall) removeChain(ctx context.Context, c chainRef) error {
	_, err := f.run.Run(ctx, nil, c.tool, "-w", "-t", c.table, "-S", c.name)
	if exitCode(err) == 1 {
		return nil // no such chain, so no jumps into it either
	}
	if err != nil {
		return err
	}
	for _, j := range f.jumps() {
		if j.to == c {
			if err := f.removeJump(ctx, j); err != nil {
				return err
			}
		}
	}
	for _, op := range []string{"-F", "-X"} {
		if _, err := f.run.Run(ctx, nil, c.tool, "-w", "-t", c.table, op, c.name); err != nil {
			return err
		}
	}
	return nil
}

// removeJump deletes every copy of j (exit code 1: none left).
func (f *firewall) removeJump(ctx context.Context, j jump) error {
	args := append([]string{"-w", "-t", j.to.table, "-D", j.hook}, j.rule()...)
	for range 16 {
		_, err := f.run.Run(ctx, nil, j.to.tool, args...)
		if exitCode(err) == 1 {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}
