package proxy

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestHostNameReachesTheGatewayOnlyWhenNamed: host.deltabox.internal resolves to the sandbox
// network's gateway; like any address of the node, the proxy dials it only for a rule that
// names it, never through a wildcard.
func TestHostNameReachesTheGatewayOnlyWhenNamed(t *testing.T) {
	up := newUpstream(t, false)
	port := strings.TrimPrefix(up.URL, "http://127.0.0.1:")
	target := "http://" + HostName + ":" + port + "/on-host"
	if _, err := url.Parse(target); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, WithGateway(mustAddr("127.0.0.1")))
	e.register(2, "sb-wild", "version: 1\nrules:\n  - {host: '*', action: pass}\n")
	e.register(3, "sb-named", "version: 1\nrules:\n  - {host: "+HostName+", action: pass}\n")
	if st, r := getStatus(t, e.client(2), target); st != http.StatusForbidden {
		t.Errorf("through a wildcard rule: %d %q, want 403", st, r)
	}
	if st, r := getStatus(t, e.client(3), target); st != http.StatusOK {
		t.Errorf("through a rule naming %s: %d %q, want 200", HostName, st, r)
	}
	if got := up.seen(); len(got) != 1 || got[0].Path != "/on-host" {
		t.Fatalf("the host service saw %+v", got)
	}
	noGW := newEnv(t)
	noGW.register(2, "sb-x", "version: 1\nrules:\n  - {host: "+HostName+", action: pass}\n")
	if st, r := getStatus(t, noGW.client(2), target); st == http.StatusOK {
		t.Errorf("without a gateway: %d %q, want a refusal", st, r)
	}
}
