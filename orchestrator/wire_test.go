package orchestrator

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/initproto"
)

// TestWireTypesMatchPool fails when a field is added to a pool type that travels on the wire
// but not to its api twin (or the reverse): the conversion would drop it silently.
func TestWireTypesMatchPool(t *testing.T) {
	pairs := []struct{ internal, wire any }{
		{pool.Template{}, api.Template{}},
		{pool.PoolInfo{}, api.PoolInfo{}},
		{pool.Sandbox{}, api.Sandbox{}},
		{pool.LeaseResult{}, api.LeaseResult{}},
		{initproto.ExitStatus{}, api.ExitStatus{}},
		{pool.Limits{}, api.Limits{}},
		{pool.Isolation{}, api.Isolation{}},
	}
	for _, p := range pairs {
		in, out := jsonFields(reflect.TypeOf(p.internal)), jsonFields(reflect.TypeOf(p.wire))
		for i, f := range in { // names the API changed (issue 19); the pool's are on disk
			if r, ok := wireRenames[strings.SplitN(f, "(", 2)[0]]; ok {
				in[i] = r + strings.ReplaceAll(strings.TrimPrefix(f, strings.SplitN(f, "(", 2)[0]), strings.SplitN(f, "(", 2)[0], r)
			}
		}
		if !reflect.DeepEqual(in, out) {
			t.Errorf("%T carries %v on the wire, %T carries %v", p.internal, in, p.wire, out)
		}
	}
}

// TestWireConversionKeepsValues checks that every field survives the conversion: the JSON of
// the converted value is the JSON of the pool value.
func TestWireConversionKeepsValues(t *testing.T) {
	tmpl := pool.Template{Name: "p", Image: "img", CPUs: 1.5, MemoryBytes: 64 << 20, Pids: 9, DiskBytes: 1 << 30, Env: []string{"A=1"},
		Workdir: "/w", Labels: map[string]string{"k": "v"}, EgressPolicy: "allow: []", MinReady: 2, Max: 5, NoUserNamespace: true}
	sb := pool.Sandbox{ID: "sb-1", Pool: "p", Container: "c", Image: "img", Env: []string{"B=2"},
		Labels: map[string]string{"l": "m"}, Workdir: "/w", LeasedAt: time.Unix(10, 0).UTC(), Created: time.Unix(5, 0).UTC(),
		InitPid: 42, IP: "10.0.0.2", EgressPolicy: "deny", RunDir: "/run/x",
		Limits: pool.Limits{CPUs: 1, MemoryBytes: 2, Pids: 3, DiskBytes: 4}, Isolation: pool.SandboxIsolation()}
	sb.Isolation.IDMapping = &pool.IDMapping{HostID: pool.IDRangeFirst, Size: pool.IDRangeSize}
	st := initproto.ExitStatus{Code: 137, Signal: "SIGKILL", TimedOut: true, StdoutTruncated: true, StderrTruncated: true,
		Error: "e", Pid: 7, Duration: time.Second}
	same := func(a, b any) {
		t.Helper()
		ja, _ := json.Marshal(renamed(t, a))
		jb, _ := json.Marshal(renamed(t, b)) // key order aside
		if string(ja) != string(jb) {
			t.Errorf("conversion changed the wire form:\n pool %s\n api  %s", ja, jb)
		}
	}
	same(tmpl, apiTemplate(tmpl))
	if back := poolTemplate(apiTemplate(tmpl)); !reflect.DeepEqual(back, tmpl) {
		t.Errorf("template round trip: %+v, want %+v", back, tmpl)
	}
	info := pool.PoolInfo{Template: tmpl, Ready: 1, Creating: 2, Leased: 3, Limits: sb.Limits, Isolation: sb.Isolation}
	same(info, apiPoolInfo(info))
	if j, _ := json.Marshal(apiPoolInfos(nil)); string(j) != "[]" {
		t.Errorf("no pools travel as %s, want []", j)
	}
	same([]pool.PoolInfo{info}, apiPoolInfos([]pool.PoolInfo{info}))
	same(sb, apiSandbox(sb))
	if j, _ := json.Marshal(apiSandboxes(nil)); string(j) != "[]" {
		t.Errorf("no sandboxes travel as %s, want []", j)
	}
	lr := pool.LeaseResult{Sandbox: sb, Cold: true}
	same(lr, apiLeaseResult(lr))
	same(st, apiExitStatus(st))
}

// wireRenames are the pool's JSON names the API spells differently: the pool's records keep
// theirs on disk, the API follows docs/design.md's vocabulary.
var wireRenames = map[string]string{"id": "sandbox", "duration_ns": "duration_ms"}

// renamed is v's JSON form (as a generic value, key order aside) with wireRenames applied;
// nanoseconds become milliseconds.
func renamed(t *testing.T, v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var g any
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	var walk func(any) any
	walk = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			out := map[string]any{}
			for k, v := range x {
				if r, ok := wireRenames[k]; ok {
					if k == "duration_ns" {
						v = v.(float64) / 1e6
					}
					k = r
				}
				out[k] = walk(v)
			}
			return out
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		}
		return x
	}
	return walk(g)
}

// jsonFields lists the JSON names of t's encoded fields, embedded structs flattened.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && tag == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		name := f.Name
		if n, _, _ := strings.Cut(tag, ","); n != "" {
			name = n
		}
		out = append(out, name+"("+tag+")")
	}
	return out
}
