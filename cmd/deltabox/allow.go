package main

import (
	"net"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
)

// allowFlag is --allow on lease and pool create: a shortcut for an egress policy.
var allowFlag = &cli.StringSliceFlag{Name: "allow", Usage: "let sandboxes send to `HOST[:PORT][,METHOD...]` now (a pass rule; repeatable); " +
	"other requests get the default: reads pass, writes are held (deltabox policy default)"}

// allowRule and allowPolicy are the part of the policy format (docs/egress-policy.md) that
// --allow writes; their tags are the format's field names (the tests decode with them).
type allowRule struct {
	Host    string   `yaml:"host"`
	Ports   []int    `yaml:"ports,omitempty,flow"`
	Methods []string `yaml:"methods,omitempty,flow"`
	Action  string   `yaml:"action"`
}

type allowPolicy struct {
	Version int         `yaml:"version"`
	Default string      `yaml:"default"`
	Rules   []allowRule `yaml:"rules"`
}

// policyFromFlags returns the egress policy of --egress-policy FILE or --allow, or "".
func policyFromFlags(c *cli.Context) (string, error) {
	allows := c.StringSlice("allow")
	if len(allows) == 0 {
		return readOptionalFile(c.String("egress-policy"))
	}
	if c.String("egress-policy") != "" {
		return "", usagef("--allow and --egress-policy do not mix: put the rule in the file (deltabox policy default shows the format)")
	}
	return allowPolicyText(allows)
}

// allowPolicyText is the policy of --allow rules: each rule passes, then reads pass and
// everything else is held (the default policy's behaviour).
func allowPolicyText(allows []string) (string, error) {
	p := allowPolicy{Version: 1, Default: "hold"}
	for _, a := range allows {
		r, err := parseAllow(a)
		if err != nil {
			return "", err
		}
		p.Rules = append(p.Rules, r)
	}
	p.Rules = append(p.Rules, allowRule{Host: "*", Methods: []string{"GET", "HEAD", "OPTIONS"}, Action: "pass"})
	return p.yaml(), nil
}

// yaml writes the policy in the policy format. Written by hand, not by yaml.v3, because the
// cli build leaves yaml.v3 out (lite_cli.go) and this policy's shape is fixed: every string
// is double-quoted with Go's escapes (\n, \", \xNN, \uNNNN), which YAML's double-quoted
// scalars read the same. TestAllowPolicyYAML decodes it with yaml.v3 and the proxy's parser.
func (p allowPolicy) yaml() string {
	var b strings.Builder
	b.WriteString("version: " + strconv.Itoa(p.Version) + "\ndefault: " + strconv.Quote(p.Default) + "\nrules:\n")
	for _, r := range p.Rules {
		b.WriteString("  - host: " + strconv.Quote(r.Host) + "\n")
		if len(r.Ports) > 0 {
			ports := make([]string, len(r.Ports))
			for i, port := range r.Ports {
				ports[i] = strconv.Itoa(port)
			}
			b.WriteString("    ports: [" + strings.Join(ports, ", ") + "]\n")
		}
		if len(r.Methods) > 0 {
			methods := make([]string, len(r.Methods))
			for i, m := range r.Methods {
				methods[i] = strconv.Quote(m)
			}
			b.WriteString("    methods: [" + strings.Join(methods, ", ") + "]\n")
		}
		b.WriteString("    action: " + strconv.Quote(r.Action) + "\n")
	}
	return b.String()
}

// parseAllow reads HOST[:PORT][,METHOD...] ("api.openai.com:443,POST", "[::1]:8080").
func parseAllow(s string) (allowRule, error) {
	parts := strings.Split(s, ",")
	r := allowRule{Host: parts[0], Action: "pass"}
	if h, p, err := net.SplitHostPort(parts[0]); err == nil {
		port, perr := strconv.Atoi(p)
		if perr != nil || port < 1 || port > 65535 {
			return r, usagef("--allow %q: port %q is not 1-65535", s, p)
		}
		r.Host, r.Ports = h, []int{port}
	}
	if r.Host == "" || strings.ContainsAny(r.Host, " /") || !utf8.ValidString(r.Host) || strings.ContainsFunc(r.Host, unicode.IsControl) {
		return r, usagef("--allow %q: want HOST[:PORT][,METHOD...], e.g. api.openai.com:443,POST", s)
	}
	for _, m := range parts[1:] {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" || strings.ContainsFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) {
			return r, usagef("--allow %q: %q is not an HTTP method", s, m)
		}
		r.Methods = append(r.Methods, m)
	}
	return r, nil
}
