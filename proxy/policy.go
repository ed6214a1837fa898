package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"path"
	"regexp"
	"strings"
	"text/template"

	"github.com/containerd/errdefs"
	"gopkg.in/yaml.v3"
)

// Action is what the proxy does with a request.
type Action string

// The actions a rule (or a policy's default) can name.
const (
	ActionPass       Action = "pass"
	ActionHold       Action = "hold"
	ActionCompensate Action = "compensate"
	ActionDeny       Action = "deny"
)

// Policy is a parsed egress policy: rules matched in order, first match wins, and a default.
// A nil *Policy passes GET, HEAD and OPTIONS and holds every other method.
type Policy struct {
	Default Action
	Rules   []Rule
}

// Rule is one policy rule. Empty Ports, Methods or PathPrefix match anything.
type Rule struct {
	Host       string // exact name, IP literal, "*.suffix" or "*"
	Ports      []int
	Methods    []string
	PathPrefix string
	Action     Action
	Record     bool                // pass only: keep the upstream's answers for replay (replay.go)
	Response   *SyntheticResponse  // hold only: the answer the sandbox gets
	Compensate *CompensateTemplate // compensate only
	Line       int                 // line of the rule in the policy source
}

// SyntheticResponse is the answer a held request gets instead of the upstream's.
type SyntheticResponse struct {
	Status  int
	Body    string
	Headers map[string]string
}

// CompensateTemplate is the request sent on rollback past a compensate effect. URL, Body and
// header values are text/template templates filled from the original request and response.
type CompensateTemplate struct {
	Method  string
	URL     *template.Template
	Body    *template.Template
	Headers map[string]*template.Template
}

type rawPolicy struct {
	Version int       `yaml:"version"`
	Default string    `yaml:"default"`
	Rules   []rawRule `yaml:"rules"`
}

type rawRule struct {
	Host       string         `yaml:"host"`
	Ports      []int          `yaml:"ports"`
	Methods    []string       `yaml:"methods"`
	PathPrefix string         `yaml:"path_prefix"`
	Action     string         `yaml:"action"`
	Record     bool           `yaml:"record"`
	Response   *rawResponse   `yaml:"response"`
	Compensate *rawCompensate `yaml:"compensate"`
}

type rawResponse struct {
	Status  int               `yaml:"status"`
	Body    string            `yaml:"body"`
	Headers map[string]string `yaml:"headers"`
}

type rawCompensate struct {
	Method  string            `yaml:"method"`
	URL     string            `yaml:"url"`
	Body    string            `yaml:"body"`
	Headers map[string]string `yaml:"headers"`
}

// ParsePolicy parses a version 1 YAML policy. Unknown fields and invalid values are
// errdefs.ErrInvalidArgument naming the line.
func ParsePolicy(src []byte) (*Policy, error) {
	var raw rawPolicy
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("policy: %s: %w", yamlProblems(err), errdefs.ErrInvalidArgument)
	}
	var doc yaml.Node
	_ = yaml.Unmarshal(src, &doc) // cannot fail: the same bytes decoded above
	if raw.Version != 1 {
		return nil, policyErr(fieldLine(&doc, "version"), "version must be 1, got %d", raw.Version)
	}
	p := &Policy{Default: ActionDeny}
	if raw.Default != "" {
		p.Default = Action(raw.Default)
	}
	if p.Default != ActionPass && p.Default != ActionHold && p.Default != ActionDeny {
		return nil, policyErr(fieldLine(&doc, "default"), "default must be pass, hold or deny, got %q", raw.Default)
	}
	lines := ruleLines(&doc)
	for i, rr := range raw.Rules {
		r, err := buildRule(rr, lines[i])
		if err != nil {
			return nil, err
		}
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

func policyErr(line int, format string, args ...any) error {
	return fmt.Errorf("policy: line %d: %s: %w", line, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// fieldLine returns the line of a top-level key, or 1.
func fieldLine(doc *yaml.Node, key string) int {
	m := topMapping(doc)
	for i := 0; m != nil && i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i].Line
		}
	}
	return 1
}

func topMapping(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 && doc.Content[0].Kind == yaml.MappingNode {
		return doc.Content[0]
	}
	return nil
}

// ruleLines returns the line of each rule, indexed like rawPolicy.Rules.
func ruleLines(doc *yaml.Node) map[int]int {
	out := map[int]int{}
	m := topMapping(doc)
	for i := 0; m != nil && i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "rules" {
			for j, n := range m.Content[i+1].Content {
				out[j] = n.Line
			}
		}
	}
	return out
}

func buildRule(rr rawRule, line int) (Rule, error) {
	r := Rule{Ports: rr.Ports, PathPrefix: rr.PathPrefix, Action: Action(rr.Action), Line: line}
	host, err := normalizeRuleHost(rr.Host)
	if err != nil {
		return r, policyErr(line, "%v", err)
	}
	r.Host = host
	for _, pt := range rr.Ports {
		if pt < 1 || pt > 65535 {
			return r, policyErr(line, "port %d out of range", pt)
		}
	}
	for _, m := range rr.Methods {
		if m == "" || strings.ContainsFunc(m, func(c rune) bool { return c <= ' ' || c >= 0x7f }) {
			return r, policyErr(line, "invalid method %q", m)
		}
		r.Methods = append(r.Methods, strings.ToUpper(m))
	}
	if rr.PathPrefix != "" && !strings.HasPrefix(rr.PathPrefix, "/") {
		return r, policyErr(line, "path_prefix %q must start with /", rr.PathPrefix)
	}
	if err := buildRuleAction(&r, rr); err != nil {
		return r, policyErr(line, "%v", err)
	}
	return r, nil
}

func buildRuleAction(r *Rule, rr rawRule) error {
	switch r.Action {
	case ActionPass, ActionDeny, ActionHold, ActionCompensate:
	case "":
		return fmt.Errorf("action is required")
	default:
		return fmt.Errorf("unknown action %q (pass, hold, compensate or deny)", rr.Action)
	}
	if rr.Response != nil && r.Action != ActionHold {
		return fmt.Errorf("response is only allowed with action hold")
	}
	if rr.Record && r.Action != ActionPass {
		return fmt.Errorf("record is only allowed with action pass")
	}
	r.Record = rr.Record
	if (rr.Compensate != nil) != (r.Action == ActionCompensate) {
		return fmt.Errorf("action compensate needs a compensate block, and only it may have one")
	}
	if rr.Response != nil {
		resp, err := buildResponse(*rr.Response)
		if err != nil {
			return err
		}
		r.Response = resp
	}
	if rr.Compensate != nil {
		c, err := buildCompensate(*rr.Compensate)
		if err != nil {
			return err
		}
		r.Compensate = c
	}
	return nil
}

func buildResponse(rr rawResponse) (*SyntheticResponse, error) {
	if rr.Status == 0 {
		rr.Status = http.StatusAccepted
	}
	if rr.Status < 200 || rr.Status > 599 {
		return nil, fmt.Errorf("response status %d out of range 200-599", rr.Status)
	}
	for k, v := range rr.Headers {
		if !validHeader(k, v) {
			return nil, fmt.Errorf("invalid response header %q", k)
		}
	}
	return &SyntheticResponse{Status: rr.Status, Body: rr.Body, Headers: rr.Headers}, nil
}

func buildCompensate(rc rawCompensate) (*CompensateTemplate, error) {
	if rc.Method == "" || rc.URL == "" {
		return nil, fmt.Errorf("compensate needs method and url")
	}
	c := &CompensateTemplate{Method: strings.ToUpper(rc.Method), Headers: map[string]*template.Template{}}
	var err error
	if c.URL, err = parseTemplate("url", rc.URL); err != nil {
		return nil, err
	}
	if c.Body, err = parseTemplate("body", rc.Body); err != nil {
		return nil, err
	}
	for k, v := range rc.Headers {
		if !validHeader(k, "") {
			return nil, fmt.Errorf("invalid compensate header %q", k)
		}
		if c.Headers[k], err = parseTemplate("header "+k, v); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func parseTemplate(name, text string) (*template.Template, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("compensate %s template: %w", name, err)
	}
	return t, nil
}

func validHeader(k, v string) bool {
	if k == "" || strings.ContainsFunc(k, func(c rune) bool { return c <= ' ' || c >= 0x7f || c == ':' }) {
		return false
	}
	return !strings.ContainsAny(v, "\r\n\x00")
}

// normalizeRuleHost lower-cases a rule's host and checks its shape.
func normalizeRuleHost(h string) (string, error) {
	h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
	if h == "" {
		return "", fmt.Errorf("host is required")
	}
	if h == "*" {
		return h, nil
	}
	if ip, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return ip.Unmap().String(), nil
	}
	name := strings.TrimPrefix(h, "*.")
	if !validHostname(name) {
		return "", fmt.Errorf("invalid host %q (exact name, IP literal or *.suffix)", h)
	}
	return h, nil
}

// decision is the outcome of matching one request against a policy.
type decision struct {
	action   Action
	rule     *Rule  // nil for a default
	name     string // for logs: "rules[i] (line n)" or "default"
	explicit bool   // the matching rule names the host exactly (may reach private addresses)
}

// decide matches a request. host is normalized (lower case, IP literals unmapped).
func (p *Policy) decide(host string, port int, method, cleanPath string) decision {
	if p == nil {
		if method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions {
			return decision{action: ActionPass, name: "default(no policy)"}
		}
		return decision{action: ActionHold, name: "default(no policy)"}
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.matches(host, port, method, cleanPath) {
			name := fmt.Sprintf("rules[%d] (line %d)", i, r.Line)
			return decision{action: r.Action, rule: r, name: name, explicit: r.names(host)}
		}
	}
	return decision{action: p.Default, name: "default"}
}

// names reports whether the rule names host exactly (not through a wildcard).
func (r *Rule) names(host string) bool { return r.Host == host }

// namesHost reports whether any rule names host exactly.
func (p *Policy) namesHost(host string) bool {
	if p == nil {
		return false
	}
	for i := range p.Rules {
		if p.Rules[i].names(host) {
			return true
		}
	}
	return false
}

func (r *Rule) matches(host string, port int, method, cleanPath string) bool {
	if !matchHost(r.Host, host) {
		return false
	}
	if len(r.Ports) > 0 && !contains(r.Ports, port) {
		return false
	}
	if len(r.Methods) > 0 && !contains(r.Methods, method) {
		return false
	}
	return r.PathPrefix == "" || strings.HasPrefix(cleanPath, r.PathPrefix)
}

func matchHost(pattern, host string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:])
	default:
		return pattern == host
	}
}

func contains[T comparable](xs []T, x T) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// cleanPath resolves dot segments so that a path prefix cannot be escaped with /v1/../admin;
// a trailing slash is kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// policyFields are the keys each level of a policy takes, for messages about unknown ones.
var policyFields = map[string]string{
	"rawPolicy":     "version, default, rules",
	"rawRule":       "host, ports, methods, path_prefix, action, response, compensate",
	"rawResponse":   "status, body, headers",
	"rawCompensate": "method, url, body, headers",
}

var (
	yamlUnknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S*\.(\w+)$`)
	yamlWrongType    = regexp.MustCompile(`^line (\d+): cannot unmarshal !!(\w+) ` + "`" + `(.*)` + "`" + ` into (\S+)$`)
)

// yamlProblems rewrites yaml.v3's decoding errors in the policy's words: the line and the
// field, never Go type names ("line 4: unknown field colour (a rule has host, ports, ...)").
func yamlProblems(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	out := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		switch m := yamlUnknownField.FindStringSubmatch(e); {
		case m != nil:
			out = append(out, fmt.Sprintf("line %s: unknown field %q (allowed here: %s)", m[1], m[2], policyFields[m[3]]))
		default:
			if m := yamlWrongType.FindStringSubmatch(e); m != nil {
				out = append(out, fmt.Sprintf("line %s: %q is not %s", m[1], m[3], yamlWant(m[4])))
			} else {
				out = append(out, e)
			}
		}
	}
	return strings.Join(out, "; ")
}

// yamlWant names what a Go type wants of a YAML value.
func yamlWant(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping of names to values"
	case strings.Contains(goType, "int"):
		return "a whole number"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "proxy.raw") || strings.HasPrefix(goType, "*proxy.raw"):
		return "a mapping (key: value lines)"
	}
	return "of the right kind"
}
