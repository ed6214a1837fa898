package orchestrator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/deltabox/deltabox/internal/rootfs"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// specPath is the OpenAPI description of the API (docs/api/openapi.yaml).
const specPath = "../docs/api/openapi.yaml"

type openAPI struct {
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas map[string]*schema `yaml:"schemas"`
	} `yaml:"components"`
}

// schema is the part of a JSON schema this test reads.
type schema struct {
	Ref        string             `yaml:"$ref"`
	Required   []string           `yaml:"required"`
	Properties map[string]*schema `yaml:"properties"`
	AllOf      []*schema          `yaml:"allOf"`
}

func loadSpec(t *testing.T) openAPI {
	t.Helper()
	data, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	var s openAPI
	if err := yaml.Unmarshal(data, &s); err != nil {
		t.Fatalf("parse %s: %v", specPath, err)
	}
	return s
}

// specRoutes lists "METHOD /path" for every operation of the spec.
func specRoutes(s openAPI) []string {
	var out []string
	for path, item := range s.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head":
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	slices.Sort(out)
	return out
}

// hostPrefix is what checkpointRoutes' prefix is on the host API.
const hostPrefix = "/v1/sandboxes/{id}"

// registeredRoutes finds every mux.HandleFunc pattern in the package's sources; patterns
// built from checkpointRoutes' prefix are returned in byFunc["checkpointRoutes"] too.
func registeredRoutes(t *testing.T) (all []string, byFunc map[string][]string) {
	t.Helper()
	files, _ := filepath.Glob("*.go")
	byFunc = map[string][]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fd, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 2 {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
					return true
				}
				p := evalPattern(t, fset, call.Args[0])
				if p != "/" { // the catch-all answering not_found
					all = append(all, p)
					byFunc[fd.Name.Name] = append(byFunc[fd.Name.Name], p)
				}
				return true
			})
		}
	}
	slices.Sort(all)
	return slices.Compact(all), byFunc
}

// evalPattern evaluates a route pattern: string literals joined with +, and prefix.
func evalPattern(t *testing.T, fset *token.FileSet, e ast.Expr) string {
	switch x := e.(type) {
	case *ast.BasicLit:
		s, err := strconv.Unquote(x.Value)
		if err == nil {
			return s
		}
	case *ast.BinaryExpr:
		if x.Op == token.ADD {
			return evalPattern(t, fset, x.X) + evalPattern(t, fset, x.Y)
		}
	case *ast.Ident:
		if x.Name == "prefix" {
			return hostPrefix
		}
	}
	t.Fatalf("%s: route pattern this test cannot evaluate (teach evalPattern)", fset.Position(e.Pos()))
	return ""
}

var pathParam = regexp.MustCompile(`\{[a-z]+\}`)

// TestOpenAPICoversEveryRoute fails when a route the daemon registers (on its socket or on a
// sandbox's) is missing from docs/api/openapi.yaml, or the spec names one that does not exist.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	spec := specRoutes(loadSpec(t))
	host, byFunc := registeredRoutes(t)
	if len(host) < 30 {
		t.Fatalf("found only %d routes in the sources: the scan is broken", len(host))
	}
	// The scan must see what the server really serves: each pattern routes to itself.
	mux := http.NewServeMux()
	(&Orchestrator{}).routes(mux)
	for _, p := range host {
		if p == "GET /v1/info" { // registered by Handler, next to routes
			continue
		}
		method, path, _ := strings.Cut(p, " ")
		req := httptest.NewRequest(method, pathParam.ReplaceAllString(path, "x1"), nil)
		if _, got := mux.Handler(req); got != p {
			t.Errorf("scanned route %q is served by %q", p, got)
		}
	}
	want := slices.Clone(host)
	for _, p := range byFunc["checkpointRoutes"] { // the sandbox's own socket: /v1/self/...
		method, path, _ := strings.Cut(p, " ")
		rest := strings.TrimPrefix(path, hostPrefix+"/")
		if rest != "commit" {
			want = append(want, method+" /v1/self/"+rest)
		}
	}
	slices.Sort(want)
	for _, r := range want {
		if !slices.Contains(spec, r) {
			t.Errorf("route %s is not in %s", r, specPath)
		}
	}
	for _, r := range spec {
		if !slices.Contains(want, r) {
			t.Errorf("%s describes %s, which the daemon does not serve", specPath, r)
		}
	}
}

// TestOpenAPISchemasMatchTheWireTypes checks the spec's schemas against the Go wire types:
// every JSON field is a property, every property is a field, and the required fields are
// exactly those that are always present (no omitempty) in an answer, and never a field that
// may be left out in a request.
func TestOpenAPISchemasMatchTheWireTypes(t *testing.T) {
	schemas := loadSpec(t).Components.Schemas
	types := map[string]any{
		"ErrorBody": api.ErrorBody{}, "Error": api.Error{}, "Info": api.Info{}, "Component": api.Component{},
		"Template": api.Template{}, "PoolInfo": api.PoolInfo{}, "Limits": api.Limits{}, "Isolation": api.Isolation{},
		"ScaleRequest": api.ScaleRequest{}, "LeaseRequest": api.LeaseRequest{}, "Sandbox": api.Sandbox{},
		"Lease": api.Lease{}, "AdoptRequest": api.AdoptRequest{}, "ExecRequest": api.ExecRequest{},
		"ExecEvent": api.ExecEvent{}, "ExitStatus": api.ExitStatus{}, "Proc": api.Proc{}, "ExtractResult": rootfs.ExtractResult{},
		"CheckpointRequest": api.CheckpointRequest{}, "Checkpoint": api.Checkpoint{},
		"RollbackRequest": api.RollbackRequest{}, "RollbackResult": api.RollbackResult{},
		"CommitResult": api.CommitResult{}, "Diff": api.Diff{}, "StatePatchResult": api.StatePatchResult{},
		"StateEntry": api.StateEntry{}, "VerifyResult": api.VerifyResult{}, "Effect": api.Effect{},
		"RetryEffectsRequest": api.RetryEffectsRequest{}, "RetryEffectsResult": api.RetryEffectsResult{},
		"SnapshotRequest": api.SnapshotRequest{}, "RestoreRequest": api.RestoreRequest{},
		"Snapshot": api.Snapshot{}, "Progress": api.Progress{}, "StreamEvent": api.StreamEvent{},
		"Storyboard": api.Storyboard{}, "Step": api.Step{}, "PinRequest": api.PinRequest{},
	}
	for name, v := range types {
		s, ok := schemas[name]
		if !ok {
			t.Errorf("schema %s is missing", name)
			continue
		}
		props, required := flatten(schemas, s)
		fields, always := wireFields(reflect.TypeOf(v))
		for _, f := range fields {
			if _, ok := props[f]; !ok {
				t.Errorf("%s: field %q of the wire type is not a property of the schema", name, f)
			}
		}
		for p := range props {
			if !slices.Contains(fields, p) {
				t.Errorf("%s: property %q is not a field of the wire type", name, p)
			}
		}
		slices.Sort(required)
		slices.Sort(always)
		required = slices.Compact(required)
		if requests[name] { // a request needs what it must send: some of what is always encoded
			for _, r := range required {
				if !slices.Contains(always, r) {
					t.Errorf("%s: required %q may be left out (omitempty)", name, r)
				}
			}
		} else if !slices.Equal(required, always) {
			t.Errorf("%s: required %v, but the fields always present are %v", name, required, always)
		}
	}
}

// requests are the schemas of request bodies; the rest are answers.
var requests = map[string]bool{"Template": true, "ScaleRequest": true, "LeaseRequest": true, "AdoptRequest": true,
	"ExecRequest": true, "CheckpointRequest": true, "RollbackRequest": true, "RetryEffectsRequest": true,
	"SnapshotRequest": true, "RestoreRequest": true}

// flatten gathers a schema's properties and required names through $ref and allOf.
func flatten(all map[string]*schema, s *schema) (map[string]*schema, []string) {
	if s.Ref != "" {
		return flatten(all, all[strings.TrimPrefix(s.Ref, "#/components/schemas/")])
	}
	props := map[string]*schema{}
	req := slices.Clone(s.Required)
	for k, v := range s.Properties {
		props[k] = v
	}
	for _, sub := range s.AllOf {
		p, r := flatten(all, sub)
		for k, v := range p {
			props[k] = v
		}
		req = append(req, r...)
	}
	return props, req
}

// wireFields lists a struct's JSON names (embedded structs flattened) and those without
// omitempty.
func wireFields(t reflect.Type) (fields, always []string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" {
			fs, as := wireFields(f.Type)
			fields, always = append(fields, fs...), append(always, as...)
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields = append(fields, name)
		if !strings.Contains(opts, "omitempty") {
			always = append(always, name)
		}
	}
	return fields, always
}
