package network

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// fakeRunner records calls and answers from a script keyed by the command line prefix.
type fakeRunner struct {
	calls  []string
	stdin  []string
	answer func(line string) error
}

func (f *fakeRunner) Run(_ context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	line := name + " " + strings.Join(args, " ")
	f.calls = append(f.calls, line)
	if stdin != nil {
		f.stdin = append(f.stdin, string(stdin))
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

// TestFirewallEnsureIdempotent: jumps are inserted only when -C says they are missing.
func TestFirewallEnsureIdempotent(t *testing.T) {
	present := map[string]bool{}
	run := &fakeRunner{answer: func(line string) error {
		key := strings.Replace(strings.Replace(line, " -C ", " ", 1), " -I ", " ", 1)
		key = strings.Replace(key, " 1 -i", " -i", 1)
		key = strings.Replace(key, " 1 -o", " -o", 1)
		switch {
		case strings.Contains(line, " -C "):
			if !present[key] {
				return &ExitError{Cmd: line, Code: 1}
			}
		case strings.Contains(line, " -I "):
			present[key] = true
		}
		return nil
	}}
	fw := testFirewall(run)
	for i := range 2 {
		run.calls = nil
		if err := fw.ensure(context.Background()); err != nil {
			t.Fatal(err)
		}
		inserts := countPrefix(run.calls, " -I ")
		if want := []int{7, 0}[i]; inserts != want {
			t.Fatalf("ensure #%d inserted %d jumps, want %d: %v", i+1, inserts, want, run.calls)
		}
	}
	if !slices.Contains(run.calls, "iptables -w -t filter -C INPUT -i deltabox0 -j DELTABOX-INPUT") {
		t.Fatalf("calls %v", run.calls)
	}
	if len(run.stdin) != 4 || !strings.Contains(run.stdin[1], "-A DELTABOX-INPUT -j DROP") {
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
