package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// fakeRunner records calls and answers from a script keyed by the command line prefix.
type fakeRunner struct {
	calls     []string
	stdin     []string
	answer    func(line string) error
	answerOut func(line string) ([]byte, error)
}

func (f *fakeRunner) Run(_ context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	line := name + " " + strings.Join(args, " ")
	f.calls = append(f.calls, line)
	if stdin != nil {
		f.stdin = append(f.stdin, string(stdin))
	}
	if f.answerOut != nil {
		return f.answerOut(line)
	}
	if f.answer != nil {
		return nil, f.answer(line)
	}
	return nil, nil
}

func testFirewall(run Runner) *firewall {
	return &firewall{
		run: run, bridge: "deltabox0", prefix: "DELTABOX",
		subnet: DefaultSubnet, gateway: gatewayOf(DefaultSubnet),
		proxy: 3128, http: 3129, https: 3130, ipv6: true,
	}
}

func TestOptionsValidate(t *testing.T) {
	good := Options{StateDir: "/var/lib/deltabox/network", ProxyPort: 3128}.withDefaults()
	if err := good.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, mut := range map[string]func(*Options){
		"relative state dir": func(o *Options) { o.StateDir = "state" },
		"no proxy port":      func(o *Options) { o.ProxyPort = 0 },
		"ipv6 subnet":        func(o *Options) { o.Subnet = netip.MustParsePrefix("fd00::/64") },
		"tiny subnet":        func(o *Options) { o.Subnet = netip.MustParsePrefix("10.0.0.0/30") },
		"bad network name":   func(o *Options) { o.NetworkName = "Delta Box" },
		"long bridge name":   func(o *Options) { o.Bridge = "a-very-long-bridge-name" },
	} {
		o := good
		mut(&o)
		if err := o.validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	for _, id := range []string{"", "../x", "a/b", ".hidden", strings.Repeat("x", 129)} {
		if err := validateID(id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("validateID(%q) = %v, want InvalidArgument", id, err)
		}
	}
}

func TestConfList(t *testing.T) {
	o := Options{StateDir: "/s", ProxyPort: 3128}.withDefaults()
	b, err := confList(o)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Name    string
		Plugins []struct {
			Type, Bridge                     string
			IsGateway, IPMasq, PortIsolation bool
			IPAM                             struct {
				DataDir string
				Ranges  [][]map[string]string
			}
		}
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	p := conf.Plugins[0]
	if conf.Name != "deltabox" || p.Type != "bridge" || p.Bridge != "deltabox0" || p.IsGateway || p.IPMasq || !p.PortIsolation {
		t.Fatalf("bridge plugin config %s", b)
	}
	r := p.IPAM.Ranges[0][0]
	if p.IPAM.DataDir != "/s/ipam" || r["gateway"] != "10.213.0.1" || r["rangeStart"] != "10.213.0.2" || r["subnet"] != "10.213.0.0/16" {
		t.Fatalf("ipam config %s", b)
	}
}

func TestAttachmentEnv(t *testing.T) {
	a := Attachment{ProxyURL: proxyURL(netip.MustParseAddr("10.213.0.1"), 3128)}
	env := a.Env()
	for _, want := range []string{"HTTP_PROXY=http://10.213.0.1:3128", "https_proxy=http://10.213.0.1:3128", "NO_PROXY=localhost,127.0.0.1"} {
		if !slices.Contains(env, want) {
			t.Errorf("Env() = %v, missing %s", env, want)
		}
	}
}

func TestFirewallRules(t *testing.T) {
	r := testFirewall(nil).rules4()
	for _, want := range []string{
		":DELTABOX-INPUT - [0:0]",
		"-A DELTABOX-INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
		"-A DELTABOX-INPUT -s 10.213.0.0/16 -d 10.213.0.1/32 -p tcp -m tcp --dport 3128 -j ACCEPT",
		"-A DELTABOX-INPUT -s 10.213.0.0/16 -d 10.213.0.1/32 -p tcp -m tcp --dport 3130 -j ACCEPT",
		"-A DELTABOX-INPUT -j DROP",
		"-A DELTABOX-FORWARD -j DROP",
		"-A DELTABOX-PREROUTING -d 169.254.0.0/16 -j RETURN",
		"-A DELTABOX-PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.213.0.1:3129",
		"-A DELTABOX-PREROUTING -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.213.0.1:3130",
	} {
		if !strings.Contains(r, want+"\n") {
			t.Errorf("rules lack %q:\n%s", want, r)
		}
	}
	// The metadata RETURN must come before the redirects.
	if strings.Index(r, "169.254.0.0/16") > strings.Index(r, "--dport 80") {
		t.Errorf("link-local RETURN after DNAT:\n%s", r)
	}
	noRedirect := testFirewall(nil)
	noRedirect.http, noRedirect.https = 0, 0
	if r := noRedirect.rules4(); strings.Contains(r, "DNAT") || strings.Count(r, "--dport") != 1 {
		t.Errorf("rules without transparent ports:\n%s", r)
	}
}

// fakeTables models the built-in chains' rule lists for -S, -I CHAIN 1, -D and -C.
type fakeTables map[string][]string // "tool table chain" -> rules as -S prints them

func (ft fakeTables) answer(line string) ([]byte, error) {
	f := strings.Fields(line)
	if len(f) < 6 || f[1] != "-w" || f[2] != "-t" {
		return nil, nil // restores
	}
	key, op, chain := f[0]+" "+f[3]+" "+f[5], f[4], f[5]
	rest := f[6:]
	if op == "-I" {
		rest = rest[1:]
	}
	rule := strings.Join(append([]string{"-A", chain}, rest...), " ")
	switch op {
	case "-S":
		return []byte("-P " + chain + " ACCEPT\n" + strings.Join(ft[key], "\n") + "\n"), nil
	case "-I":
		ft[key] = append([]string{rule}, ft[key]...)
	case "-D", "-C":
		i := slices.Index(ft[key], rule)
		if i < 0 {
			return nil, &ExitError{Cmd: line, Code: 1}
		}
		if op == "-D" {
			ft[key] = slices.Delete(ft[key], i, i+1)
		}
	}
	return nil, nil
}

// TestFirewallEnsureIdempotent: jumps go first once, a second ensure changes nothing, and a
// foreign rule inserted above them later is put back below them.
func TestFirewallEnsureIdempotent(t *testing.T) {
	tables := fakeTables{}
	run := &fakeRunner{answerOut: tables.answer}
	fw := testFirewall(run)
	for i := range 2 {
		run.calls = nil
		if err := fw.ensure(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, want := countPrefix(run.calls, " -I "), []int{7, 0}[i]; got != want {
			t.Fatalf("ensure #%d inserted %d jumps, want %d: %v", i+1, got, want, run.calls)
		}
	}
	if got := tables["iptables filter FORWARD"]; !slices.Equal(got, []string{
		"-A FORWARD -i deltabox0 -j DELTABOX-FORWARD", "-A FORWARD -o deltabox0 -j DELTABOX-FORWARD",
	}) {
		t.Fatalf("FORWARD = %q", got)
	}
	tables["iptables filter INPUT"] = append([]string{"-A INPUT -j ACCEPT"}, tables["iptables filter INPUT"]...)
	if err := fw.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tables["iptables filter INPUT"]; !slices.Equal(got, []string{"-A INPUT -i deltabox0 -j DELTABOX-INPUT", "-A INPUT -j ACCEPT"}) {
		t.Fatalf("INPUT after a foreign insert = %q", got)
	}
	if len(run.stdin) != 6 || !strings.Contains(run.stdin[0], "-A DELTABOX-INPUT -j DROP") {
		t.Fatalf("restore inputs %q", run.stdin)
	}
}

func TestFirewallRemove(t *testing.T) {
	deleted := 0
	run := &fakeRunner{answer: func(line string) error {
		switch {
		case strings.Contains(line, "ip6tables") && strings.Contains(line, " -S "):
			return &ExitError{Cmd: line, Code: 1} // IPv6 chains already gone
		case strings.Contains(line, " -D "):
			deleted++
			if deleted%2 == 0 { // each jump present once
				return &ExitError{Cmd: line, Code: 1}
			}
		}
		return nil
	}}
	if err := testFirewall(run).remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := countPrefix(run.calls, " -X "); n != 3 {
		t.Fatalf("deleted %d chains, want the 3 IPv4 ones: %v", n, run.calls)
	}
	failing := &fakeRunner{answer: func(line string) error { return fmt.Errorf("boom") }}
	if err := testFirewall(failing).remove(context.Background()); err == nil {
		t.Fatal("remove ignored a runner failure")
	}
}

func countPrefix(calls []string, sub string) int {
	n := 0
	for _, c := range calls {
		if strings.Contains(c, sub) {
			n++
		}
	}
	return n
}

// A CNI plugin that found no room for its state (host-local writing its reservation under
// the state dir) fails with text only: it is resource_exhausted, with the plugin's words.
func TestClassifyCNIFullDisk(t *testing.T) {
	plugin := errors.New(`plugin type="host-local" failed (add): failed to allocate for range 0: open /var/lib/deltabox/network/ipam/dbx/10.88.0.5: no space left on device`)
	err := classifyCNI(plugin)
	if !errdefs.IsResourceExhausted(err) || !errors.Is(err, plugin) {
		t.Fatalf("classifyCNI(%v) = %v; want resource_exhausted wrapping the plugin's error", plugin, err)
	}
	if other := errors.New("plugin failed: no route to host"); classifyCNI(other) != other {
		t.Fatalf("classifyCNI of an unrelated error changed it: %v", classifyCNI(other))
	}
}
