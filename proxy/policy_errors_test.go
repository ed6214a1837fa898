package proxy

import (
	"strings"
	"testing"
)

// TestPolicyErrorsNameLineAndField: a bad policy is explained in its own words (line, field,
// what was expected), never with Go type names.
func TestPolicyErrorsNameLineAndField(t *testing.T) {
	cases := []struct{ src, want string }{
		{"version: 1\nrules:\n  - host: x\n    colour: red\n    action: pass\n", `line 4: unknown field "colour" (allowed here: host, ports`},
		{"version: 1\nrules:\n  - host: x\n    ports: [https]\n    action: pass\n", `line 4: "https" is not a whole number`},
		{"version: 1\nrules:\n  - host: x\n    methods: GET\n    action: pass\n", `line 4: "GET" is not a list`},
		{"version: 1\nrules:\n  - host: x\n    action: hold\n    response: {code: 201}\n", `unknown field "code" (allowed here: status, body, headers)`},
		{"version: 1\nrules:\n  - host: x\n    action: allow\n", `line 3: unknown action "allow"`},
		{"version: 2\n", "line 1: version must be 1"},
	}
	for _, c := range cases {
		_, err := ParsePolicy([]byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "proxy.raw") {
			t.Errorf("policy %q: error %v, want one containing %q and no Go type", c.src, err, c.want)
		}
	}
}
