package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// recorder relays a unix socket to the daemon's and keeps every byte each way, so that the
// answers a client got can be checked against docs/api/openapi.yaml afterwards.
type recorder struct {
	l     net.Listener
	mu    sync.Mutex
	convs []*conversation
	wg    sync.WaitGroup
}

type conversation struct{ req, resp bytes.Buffer }

func startRecorder(t *testing.T, daemonSocket string) (*recorder, string) {
	addr := filepath.Join(shortTempDir(t), "rec.sock")
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", daemonSocket)
			if err != nil {
				c.Close()
				continue
			}
			cv := &conversation{}
			r.mu.Lock()
			r.convs = append(r.convs, cv)
			r.mu.Unlock()
			r.wg.Add(2)
			go r.pipe(up, c, &cv.req)
			go r.pipe(c, up, &cv.resp)
		}
	}()
	t.Cleanup(func() { l.Close() })
	return r, addr
}

// pipe copies src to dst, keeping a copy, then half-closes dst.
func (r *recorder) pipe(dst, src net.Conn, keep *bytes.Buffer) {
	defer r.wg.Done()
	var buf bytes.Buffer
	_, _ = io.Copy(dst, io.TeeReader(src, &buf))
	r.mu.Lock()
	keep.Write(buf.Bytes())
	r.mu.Unlock()
	if uc, ok := dst.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
}

// exchanges stops the relay and returns what went through it, request and answer in order.
func (r *recorder) exchanges(t *testing.T) []exchange {
	t.Helper()
	r.l.Close()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("recorded connections still open 10 s after the client exited")
	}
	var out []exchange
	for _, cv := range r.convs {
		reqs, resps := bufio.NewReader(&cv.req), bufio.NewReader(&cv.resp)
		for {
			req, err := http.ReadRequest(reqs)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("recorded request: %v", err)
			}
			_, _ = io.Copy(io.Discard, req.Body)
			resp, err := http.ReadResponse(resps, req)
			if err != nil {
				t.Fatalf("recorded answer to %s %s: %v", req.Method, req.URL, err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("recorded answer to %s %s: %v", req.Method, req.URL, err)
			}
			out = append(out, exchange{req: req, status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: body})
		}
	}
	return out
}

type exchange struct {
	req    *http.Request
	status int
	ctype  string
	body   []byte
}

// apiSpec is docs/api/openapi.yaml as generic YAML.
type apiSpec struct {
	doc map[string]any
	mux *http.ServeMux // the spec's routes, to find which one a request took
}

func loadAPISpec(t *testing.T) apiSpec {
	data, err := os.ReadFile("../docs/api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := apiSpec{mux: http.NewServeMux()}
	if err := yaml.Unmarshal(data, &s.doc); err != nil {
		t.Fatal(err)
	}
	for path, item := range s.doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			switch method {
			case "get", "post", "put", "delete":
				s.mux.HandleFunc(strings.ToUpper(method)+" "+path, func(http.ResponseWriter, *http.Request) {})
			}
		}
	}
	return s
}

// responseSchema is the schema of the answer to r with status and content type, or nil
// when the spec has no JSON schema for it (a tar stream).
func (s apiSpec) responseSchema(r *http.Request, status int, ctype string) (op string, schema any, err error) {
	_, pattern := s.mux.Handler(r)
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		return "", nil, fmt.Errorf("%s %s matches no route of the spec", r.Method, r.URL.Path)
	}
	o := s.doc["paths"].(map[string]any)[path].(map[string]any)[strings.ToLower(method)].(map[string]any)
	resps := o["responses"].(map[string]any)
	resp, ok := resps[fmt.Sprint(status)]
	if !ok {
		resp = resps["default"]
	}
	resp = s.resolve(resp)
	content, _ := resp.(map[string]any)["content"].(map[string]any)
	mt, ok := content[strings.TrimSpace(strings.Split(ctype, ";")[0])]
	if !ok {
		return pattern, nil, fmt.Errorf("%s: status %d answered %q, which the spec does not list", pattern, status, ctype)
	}
	return pattern, mt.(map[string]any)["schema"], nil
}

func (s apiSpec) resolve(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	ref, ok := m["$ref"].(string)
	if !ok {
		return v
	}
	var cur any = s.doc
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		cur = cur.(map[string]any)[part]
	}
	return s.resolve(cur)
}

// validate checks v against the subset of JSON Schema the spec uses: $ref, allOf, oneOf,
// type (with "null"), required, properties, items, enum. It returns the first problem.
func (s apiSpec) validate(schema, v any, at string) error {
	m, ok := s.resolve(schema).(map[string]any)
	if !ok || len(m) == 0 {
		return nil // {}: anything
	}
	for _, sub := range asList(m["allOf"]) {
		if err := s.validate(sub, v, at); err != nil {
			return err
		}
	}
	if alts := asList(m["oneOf"]); len(alts) > 0 {
		var errs []error
		for _, sub := range alts {
			if err := s.validate(sub, v, at); err == nil {
				errs = nil
				break
			} else {
				errs = append(errs, err)
			}
		}
		if errs != nil {
			return fmt.Errorf("%s matches none of oneOf: %w", at, errors.Join(errs...))
		}
	}
	if t, ok := m["type"]; ok && !typeMatches(t, v) {
		return fmt.Errorf("%s: %T (%v) is not of type %v", at, v, v, t)
	}
	if enum := asList(m["enum"]); len(enum) > 0 && v != nil && !slices.Contains(enum, v) {
		return fmt.Errorf("%s: %v is none of %v", at, v, enum)
	}
	switch x := v.(type) {
	case map[string]any:
		for _, req := range asList(m["required"]) {
			if _, ok := x[req.(string)]; !ok {
				return fmt.Errorf("%s: required %q is missing", at, req)
			}
		}
		props, _ := m["properties"].(map[string]any)
		for k, pv := range x {
			if ps, ok := props[k]; ok {
				if err := s.validate(ps, pv, at+"."+k); err != nil {
					return err
				}
			}
		}
	case []any:
		if items, ok := m["items"]; ok {
			for i, e := range x {
				if err := s.validate(items, e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func asList(v any) []any { l, _ := v.([]any); return l }

func typeMatches(t, v any) bool {
	types := asList(t)
	if s, ok := t.(string); ok {
		types = []any{s}
	}
	for _, tt := range types {
		switch x := v.(type) {
		case nil:
			if tt == "null" {
				return true
			}
		case bool:
			if tt == "boolean" {
				return true
			}
		case float64:
			if tt == "number" || (tt == "integer" && x == math.Trunc(x)) {
				return true
			}
		case string:
			if tt == "string" {
				return true
			}
		case []any:
			if tt == "array" {
				return true
			}
		case map[string]any:
			if tt == "object" {
				return true
			}
		}
	}
	return false
}

// checkAgainstSpec validates every recorded JSON answer (and every line of a JSON-lines
// stream) against the spec and returns the routes seen.
func checkAgainstSpec(t *testing.T, xs []exchange) map[string]bool {
	t.Helper()
	spec := loadAPISpec(t)
	seen := map[string]bool{}
	for _, x := range xs {
		op, schema, err := spec.responseSchema(x.req, x.status, x.ctype)
		if err != nil {
			t.Error(err)
			continue
		}
		seen[op] = true
		if schema == nil || strings.HasPrefix(x.ctype, "application/x-tar") {
			continue
		}
		docs := [][]byte{x.body}
		if strings.HasPrefix(x.ctype, "application/x-ndjson") {
			docs = bytes.Split(bytes.TrimSpace(x.body), []byte("\n"))
		}
		for _, d := range docs {
			var v any
			if err := json.Unmarshal(d, &v); err != nil {
				t.Errorf("%s (%d): answer is not JSON: %v: %q", op, x.status, err, d)
				continue
			}
			if err := spec.validate(schema, v, op); err != nil {
				t.Errorf("answer %d to %s %s does not match the spec: %v\n%s", x.status, x.req.Method, x.req.URL, err, d)
			}
		}
	}
	return seen
}
