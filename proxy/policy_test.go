package proxy

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

const fullPolicy = `version: 1
default: deny
rules:
  - host: api.example.com
    ports: [443]
    methods: [GET, head]
    path_prefix: /v1/
    action: pass
  - host: api.example.com
    methods: [POST, PUT, PATCH, DELETE]
    action: hold
    response: {status: 202, body: '{"queued": true}', headers: {Content-Type: application/json}}
  - host: pay.example.com
    action: compensate
    compensate: {method: POST, url: 'https://pay.example.com/refund/{{.Response.JSON.id}}', body: '{}', headers: {X-Reason: rollback}}
  - host: '*.cdn.example.com'
    action: pass
`

func TestParsePolicyFull(t *testing.T) {
	p, err := ParsePolicy([]byte(fullPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if p.Default != ActionDeny || len(p.Rules) != 4 || p.Rules[0].Methods[1] != "HEAD" || p.Rules[1].Line != 9 {
		t.Fatalf("parsed %+v", p)
	}
	cases := []struct {
		host         string
		port         int
		method, path string
		want         Action
		explicit     bool
	}{
		{"api.example.com", 443, "GET", "/v1/items", ActionPass, true},
		{"api.example.com", 443, "GET", "/v1/../admin", ActionDeny, false},
		{"api.example.com", 8443, "GET", "/v1/items", ActionDeny, false},
		{"api.example.com", 443, "POST", "/anything", ActionHold, true},
		{"pay.example.com", 443, "POST", "/charge", ActionCompensate, true},
		{"img.cdn.example.com", 443, "GET", "/a.png", ActionPass, false},
		{"cdn.example.com", 443, "GET", "/", ActionDeny, false},
		{"evilapi.example.com", 443, "GET", "/v1/", ActionDeny, false},
	}
	for _, c := range cases {
		d := p.decide(c.host, c.port, c.method, cleanPath(c.path))
		if d.action != c.want || d.explicit != c.explicit {
			t.Errorf("%s %s:%d%s = %s (explicit %v), want %s (%v)", c.method, c.host, c.port, c.path, d.action, d.explicit, c.want, c.explicit)
		}
	}
}

func TestNilPolicy(t *testing.T) {
	var p *Policy
	for m, want := range map[string]Action{"GET": ActionPass, "HEAD": ActionPass, "OPTIONS": ActionPass, "POST": ActionHold, "DELETE": ActionHold} {
		if got := p.decide("example.com", 443, m, "/").action; got != want {
			t.Errorf("%s: %s, want %s", m, got, want)
		}
	}
}

func TestParsePolicyErrors(t *testing.T) {
	cases := map[string]struct{ src, want string }{
		"unknown field":      {"version: 1\nrules:\n  - host: a.com\n    action: pass\n    colour: red\n", "line 5"},
		"unknown top field":  {"version: 1\nfoo: bar\n", "line 2"},
		"version":            {"version: 2\n", "line 1: version must be 1"},
		"missing version":    {"default: deny\n", "version must be 1"},
		"bad default":        {"version: 1\ndefault: compensate\n", "line 2: default must be"},
		"bad action":         {"version: 1\nrules:\n  - host: a.com\n    action: allow\n", `line 3: unknown action "allow"`},
		"no action":          {"version: 1\nrules:\n  - host: a.com\n", "line 3: action is required"},
		"no host":            {"version: 1\nrules:\n  - action: pass\n", "line 3: host is required"},
		"bad host":           {"version: 1\nrules:\n  - {host: 'a b.com', action: pass}\n", "invalid host"},
		"bad wildcard":       {"version: 1\nrules:\n  - {host: 'a.*.com', action: pass}\n", "invalid host"},
		"bad port":           {"version: 1\nrules:\n  - {host: a.com, ports: [0], action: pass}\n", "port 0"},
		"bad path":           {"version: 1\nrules:\n  - {host: a.com, path_prefix: v1, action: pass}\n", "must start with /"},
		"response on pass":   {"version: 1\nrules:\n  - {host: a.com, action: pass, response: {status: 200}}\n", "only allowed with action hold"},
		"compensate missing": {"version: 1\nrules:\n  - {host: a.com, action: compensate}\n", "needs a compensate block"},
		"bad template":       {"version: 1\nrules:\n  - {host: a.com, action: compensate, compensate: {method: POST, url: 'http://a.com/{{.X'}}\n", "template"},
		"not yaml":           {"version: [1\n", "policy"},
		"wrong type":         {"version: 1\nrules: {host: a.com}\n", "line 2"},
	}
	for name, c := range cases {
		_, err := ParsePolicy([]byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: error %v, want one containing %q (invalid argument)", name, err, c.want)
		}
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{"": "/", "/v1/": "/v1/", "/v1/../admin": "/admin", "/v1//x/./y/": "/v1/x/y/", "/..": "/"} {
		if got := cleanPath(in); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", in, got, want)
		}
	}
}
