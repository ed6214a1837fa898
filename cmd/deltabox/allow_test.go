package main

import (
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/deltabox/deltabox/proxy"
)

// The policy --allow writes by hand (allowPolicy.yaml) reads back as the same policy with
// yaml.v3, the same as yaml.v3's own output of it, and passes the proxy's parser with the
// rules in order (the proxy refuses hosts that are not names, which --allow lets through to it).
func TestAllowPolicyYAML(t *testing.T) {
	cases := []struct {
		allows []string
		names  bool // host names the proxy takes
	}{
		{[]string{"api.openai.com:443,POST"}, true},
		{[]string{"[::1]:8080", "*.example.com,get,put", "*"}, true},
		{[]string{"yes", "null:80", "no", "true,DELETE", "1e3"}, true}, // words YAML reads as other types
		{[]string{"~", `a"b\c`, "x#y", "k:v:w", "-a", "[x", "{y", "'q'", "&a", "!t", "%x", "@y", "0x10"}, false},
		{[]string{"xn--bcher-kva.example:1"}, true},
		{[]string{"bücher.example", "\u00e9\u2028x"}, false},
	}
	for _, tc := range cases {
		allows := tc.allows
		text, err := allowPolicyText(allows)
		if err != nil {
			t.Fatalf("%q: %v", allows, err)
		}
		want := allowPolicy{Version: 1, Default: "hold"}
		for _, a := range allows {
			r, err := parseAllow(a)
			if err != nil {
				t.Fatal(err)
			}
			want.Rules = append(want.Rules, r)
		}
		want.Rules = append(want.Rules, allowRule{Host: "*", Methods: []string{"GET", "HEAD", "OPTIONS"}, Action: "pass"})
		var got, viaLib allowPolicy
		if err := yaml.Unmarshal([]byte(text), &got); err != nil {
			t.Fatalf("%q: yaml.v3 cannot read\n%s: %v", allows, text, err)
		}
		lib, err := yaml.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(lib, &viaLib); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(got, viaLib) {
			t.Errorf("%q: read back %+v, want %+v (yaml.v3's own: %+v)\n%s", allows, got, want, viaLib, text)
		}
		if !tc.names {
			continue
		}
		p, err := proxy.ParsePolicy([]byte(text))
		if err != nil {
			t.Fatalf("%q: the proxy refuses\n%s: %v", allows, text, err)
		}
		if p.Default != proxy.ActionHold || len(p.Rules) != len(want.Rules) {
			t.Fatalf("%q: proxy read %+v", allows, p)
		}
		for i, r := range p.Rules {
			w := want.Rules[i]
			if r.Host != w.Host || !reflect.DeepEqual(r.Ports, w.Ports) || !reflect.DeepEqual(r.Methods, w.Methods) || string(r.Action) != w.Action {
				t.Errorf("%q: proxy rule %d is %+v, want %+v", allows, i, r, w)
			}
		}
	}
}

// --allow refuses what is not a host name: spaces, paths, control characters, bad UTF-8.
func TestAllowRefusesBadHosts(t *testing.T) {
	for _, a := range []string{"", "a b", "a/b", "a\nb", "a\x00b", "a\xffb", "x:99999", "x:0", "h,P0ST"} {
		if _, err := parseAllow(a); err == nil {
			t.Errorf("--allow %q accepted", a)
		}
	}
}
