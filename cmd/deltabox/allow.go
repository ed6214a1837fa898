package main

import (
	"net"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"
)

// allowFlag is --allow on lease and pool create: a shortcut for an egress policy.
var allowFlag = &cli.StringSliceFlag{Name: "allow", Usage: "let sandboxes send to `HOST[:PORT][,METHOD...]` now (a pass rule; repeatable); " +
	"other requests get the default: reads pass, writes are held (deltabox policy default)"}

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
	p := allowPolicy{Version: 1, Default: "hold"}
	for _, a := range allows {
		r, err := parseAllow(a)
		if err != nil {
			return "", err
		}
		p.Rules = append(p.Rules, r)
	}
	p.Rules = append(p.Rules, allowRule{Host: "*", Methods: []string{"GET", "HEAD", "OPTIONS"}, Action: "pass"})
	data, err := yaml.Marshal(p)
	return string(data), err
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
	if r.Host == "" || strings.ContainsAny(r.Host, " /") {
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
