package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/client"
)

func noEnv(string) (string, bool) { return "", false }

// The front runs exactly these shapes itself (parse.go).
func TestParseFast(t *testing.T) {
	sock := "/tmp/d.sock"
	cases := []struct {
		args []string
		want call
	}{
		{[]string{"lease", "--pool", "p"}, call{verb: "lease", address: defaultAddress, pool: "p"}},
		{[]string{"--address", sock, "lease", "--pool=p"}, call{verb: "lease", address: sock, pool: "p"}},
		{[]string{"lease", "--pool", "p", "-a", "unix://" + sock}, call{verb: "lease", address: sock, pool: "p"}},
		{[]string{"-o", "text", "lease", "-o=wide", "--pool", "p"}, call{verb: "lease", address: defaultAddress, pool: "p"}},
		{[]string{"exec", "sb-1", "true"}, call{verb: "exec", address: defaultAddress, id: "sb-1", argv: []string{"true"}}},
		{[]string{"-a", sock, "exec", "sb-1", "--", "sh", "-c", "exit 3"}, call{verb: "exec", address: sock, id: "sb-1", argv: []string{"sh", "-c", "exit 3"}}},
		{[]string{"exec", "--output-cap", "4", "-a", sock, "sb-1", "echo", "-o", "json", "--", "-i"}, call{verb: "exec", address: sock, id: "sb-1", outputCap: 4, argv: []string{"echo", "-o", "json", "--", "-i"}}},
		{[]string{"exec", "sb-1", "--", "--"}, call{verb: "exec", address: defaultAddress, id: "sb-1", argv: []string{"--"}}},
		{[]string{"--version"}, call{verb: "version"}},
		{[]string{"-v"}, call{verb: "version"}},
		{[]string{"-o", "json", "lease", "--pool", "p"}, call{verb: "lease", address: defaultAddress, json: true, pool: "p"}},
		{[]string{"--output=json", "exec", "sb", "true"}, call{verb: "exec", address: defaultAddress, json: true, id: "sb", argv: []string{"true"}}},
		{[]string{"exec", "-o", "json", "sb", "echo", "-o", "text"}, call{verb: "exec", address: defaultAddress, json: true, id: "sb", argv: []string{"echo", "-o", "text"}}},
		{[]string{"checkpoint", "create", "sb"}, call{verb: "checkpoint", address: defaultAddress, id: "sb", body: []byte(`{}`)}},
		{[]string{"checkpoint", "create", "sb", "-m", "a <b> \"c\"", "--name=n1", "--processes", "--async", "-o", "json"},
			call{verb: "checkpoint", address: defaultAddress, json: true, id: "sb", body: []byte(`{"message":"a \u003cb\u003e \"c\"","name":"n1","processes":true,"async":true}`)}},
		{[]string{"-a", sock, "checkpoint", "create", "--level", "l2", "--pin", "--message=m", "sb"},
			call{verb: "checkpoint", address: sock, id: "sb", body: []byte(`{"level":"l2","message":"m","pin":true}`)}},
		{[]string{"rollback", "sb"}, call{verb: "rollback", address: defaultAddress, id: "sb", body: []byte(`{}`)}},
		{[]string{"rollback", "sb", "--to", "@~1", "--force", "--replay", "-o", "json"},
			call{verb: "rollback", address: defaultAddress, json: true, id: "sb", body: []byte(`{"to":"@~1","force":true,"replay":true}`)}},
		{[]string{"rollback", "--to=ck-1", "sb"}, call{verb: "rollback", address: defaultAddress, id: "sb", body: []byte(`{"to":"ck-1"}`)}},
		{[]string{"release", "sb"}, call{verb: "release", address: defaultAddress, ids: []string{"sb"}}},
		{[]string{"release", "a", "-o", "json", "b"}, call{verb: "release", address: defaultAddress, json: true, ids: []string{"a", "b"}}},
	}
	for _, c := range cases {
		got, ok := parse(c.args, noEnv)
		if !ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("parse(%q) = %+v, %v; want %+v", c.args, got, ok, c.want)
		}
	}
	got, ok := parse([]string{"lease", "--pool", "p"}, func(k string) (string, bool) { return sock, k == "DELTABOX_ADDRESS" })
	if !ok || got.address != sock {
		t.Errorf("DELTABOX_ADDRESS: %+v, %v", got, ok)
	}
}

// handedOver are command lines the front must not run itself: everything but the shapes of
// TestParseFast, including near misses of them.
var handedOver = [][]string{
	{"checkpoint", "create", "sb", "-m", "a", "--message", "b"}, {"checkpoint", "create", "sb", "--message=a", "-m", "b"},
	{}, {"ls"}, {"version"}, {"help"}, {"--help"}, {"-h"}, {"help", "exec"}, {"daemon", "--config", "x.toml"},
	{"lease"}, {"lease", "p"}, {"lease", "--pool"}, {"lease", "--pool", ""}, {"lease", "--pool", "a/b"}, {"lease", "--pool", "p", "--env", "A=1"},
	{"lease", "--pool", "p", "--label", "k=v"}, {"lease", "--pool", "p", "--allow", "x:1"}, {"lease", "--pool", "p", "--egress-policy", "p.yaml"},
	{"lease", "--pool", "p", "--help"}, {"lease", "--pool", "p", "--", "x"}, {"lease", "--pool", "-o"},
	{"lease", "--pool", "p", "-o", "yaml"}, {"-o", "yaml", "exec", "sb", "true"}, {"-o", "JSON", "release", "sb"},
	{"--format", "{{.sandbox}}", "lease", "--pool", "p"}, {"-o", "bogus", "lease", "--pool", "p"},
	{"--address", "tcp://h:1", "lease", "--pool", "p"}, {"--address", "http://x", "lease", "--pool", "p"}, {"--address", "", "lease", "--pool", "p"},
	{"--address", "@abstract", "exec", "sb", "true"}, {"--address", "/" + strings.Repeat("x", 120), "exec", "sb", "true"},
	{"--token-file", "t", "lease", "--pool", "p"}, {"--ca-file", "c", "exec", "sb", "true"}, {"--cert-file", "c", "lease", "--pool", "p"},
	{"exec"}, {"exec", "sb"}, {"exec", "sb", "--"}, {"exec", "-i", "sb", "cat"}, {"exec", "-t", "sb", "sh"}, {"exec", "-it", "sb", "sh"},
	{"exec", "-d", "sb", "sleep", "1"}, {"exec", "--timeout", "5", "sb", "true"}, {"exec", "-e", "A=1", "sb", "true"}, {"exec", "-w", "/", "sb", "true"},
	{"exec", "-u", "1", "sb", "true"}, {"exec", "--via", "init", "sb", "true"}, {"exec", "--output-cap", "010", "sb", "true"},
	{"exec", "--output-cap", "-1", "sb", "true"}, {"exec", "--output-cap", "x", "sb", "true"}, {"exec", "sb", "--timeout", "5", "--", "true"},
	{"exec", "sb", "-x"}, {"exec", "--", "sb", "true"}, {"exec", "s/b", "true"}, {"exec", "..", "true"}, {"exec", "sb", "true", completionFlag},
	{"--version", "ls"}, {"--version=true"}, {"-a", "/s", "--version"}, {"exec", "--help"}, {"exec", "-h", "sb", "true"},
	{"---address", "/s", "exec", "sb", "true"}, {"-=x", "exec", "sb", "true"},
	// checkpoint create, rollback, release: near misses.
	{"checkpoint"}, {"checkpoint", "create"}, {"checkpoint", "ls", "sb"}, {"checkpoint", "inspect", "sb", "@"}, {"checkpoint", "pin", "sb", "@"},
	{"checkpoint", "-o", "json", "create", "sb"}, {"checkpoint", "create", "a", "b"}, {"checkpoint", "create", "sb", "--pin=false"},
	{"checkpoint", "create", "sb", "--async=true"}, {"checkpoint", "create", "sb", "--processes=false"}, {"checkpoint", "create", "sb", "-m"},
	{"checkpoint", "create", "sb", "-m", ""}, {"checkpoint", "create", "sb", "-m", "-x"}, {"checkpoint", "create", "sb", "--name"},
	{"checkpoint", "create", "sb", "--bogus"}, {"checkpoint", "create", "sb", "--help"}, {"checkpoint", "create", "--", "sb"},
	{"checkpoint", "create", "s/b"}, {"checkpoint", "create", "sb", "--format", "{{.checkpoint}}"}, {"checkpoint", "create", "sb", "-o", "yaml"},
	{"checkpoint", "create", "sb", "--level"}, {"checkpoint", "create", "sb", "--message"}, {"checkpoint", "create", "sb", "-M", "x"},
	{"rollback"}, {"rollback", "sb", "ck"}, {"rollback", "sb", "--to"}, {"rollback", "sb", "--to", ""}, {"rollback", "sb", "--to", "-1"},
	{"rollback", "sb", "--force=false"}, {"rollback", "sb", "--replay=1"}, {"rollback", "sb", "--bogus"}, {"rollback", "sb", "-h"},
	{"rollback", "--", "sb"}, {"rollback", "sb", "-o", "yaml"}, {"rollback", "sb", "-to", "x", "-y"}, {"rollback", "..", "--to", "x"},
	{"release"}, {"release", "--", "sb"}, {"release", "sb", "--all"}, {"release", "sb", "-f"}, {"release", "sb", "s/b"},
	{"release", "sb", "-o", "yaml"}, {"release", "-o"}, {"release", "sb", completionFlag}, {"commit", "sb"}, {"checkpoints", "create", "sb"},
}

func TestParseHandsOver(t *testing.T) {
	for _, args := range handedOver {
		if c, ok := parse(args, noEnv); ok {
			t.Errorf("parse(%q) = %+v: the front would run it; want it handed over", args, c)
		}
	}
	if _, ok := parse([]string{"lease", "--pool", "p"}, func(k string) (string, bool) { return "tcp://h:1", k == "DELTABOX_ADDRESS" }); ok {
		t.Errorf("DELTABOX_ADDRESS=tcp://... was not handed over")
	}
}

// Every command line the front does not run reaches deltabox-cli next to it unchanged; a
// missing deltabox-cli is named.
func TestHandOverKeepsArgs(t *testing.T) {
	if testing.Short() {
		testutil.SkipOrFail(t, "builds the front (-short)") // CI runs without -short: a skip there fails
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "deltabox")
	build := exec.Command("go", "build", "-ldflags", fastLDFlags, "-o", bin, ".") // as make build builds it: the C front in
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the front: %v\n%s", err, out)
	}
	run := func(args ...string) (string, string, int) {
		var out, errOut strings.Builder
		c := exec.Command(bin, args...)
		c.Stdout, c.Stderr = &out, &errOut
		c.Env = append(os.Environ(), "DELTABOX_ADDRESS=/nonexistent/deltabox.sock")
		_ = c.Run()
		return out.String(), errOut.String(), c.ProcessState.ExitCode()
	}
	if _, errOut, code := run("ls"); code != 1 || !strings.Contains(errOut, "is run by deltabox-cli, which should be installed next to "+bin) {
		t.Errorf("ls without deltabox-cli: exit %d, stderr %q; want it named", code, errOut)
	}
	// The fake prints its arguments one a line, in brackets, so that empty ones show.
	fake := "#!/bin/sh\nfor a in \"$@\"; do printf '[%s]\\n' \"$a\"; done\nexit 42\n"
	if err := os.WriteFile(filepath.Join(dir, cliBinary), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range handedOver {
		want := ""
		for _, a := range args {
			want += "[" + a + "]\n"
		}
		if out, errOut, code := run(args...); out != want || code != 42 {
			t.Errorf("deltabox %q: exit %d, stdout %q, stderr %q; want %q from %s (exit 42)", args, code, out, errOut, want, cliBinary)
		}
	}
	// The fast shapes are not handed over (the socket is missing: the front says so itself).
	for _, args := range [][]string{{"lease", "--pool", "p"}, {"exec", "sb-1", "true"}} {
		if out, errOut, code := run(args...); code != 1 || strings.Contains(out, "[") || !strings.Contains(errOut, "cannot reach the DeltaBox daemon at /nonexistent/deltabox.sock") {
			t.Errorf("deltabox %q: exit %d, stdout %q, stderr %q; want the front's unavailable error", args, code, out, errOut)
		}
	}
}

// fastLDFlags is the Makefile's FAST_LDFLAGS: the front linked statically with glibc.
const fastLDFlags = "-linkmode external -extldflags -static"

// TestFastBuildIsLight keeps what the front is for: built as make build builds it (cgo), it
// carries the C front, and links none of the packages whose initialisers and pages make
// deltabox-cli's start (main.go).
func TestFastBuildIsLight(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.CFiles}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "[cfront.c]" {
		t.Errorf("go list -f {{.CFiles}} with cgo: %s, %v; want [cfront.c] (the C front)", out, err)
	}
	cmd = exec.Command("go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	heavy := []string{"net", "net/http", "crypto/tls", "crypto/x509", "encoding/json", "text/template", "regexp", "reflect",
		"github.com/urfave/cli/v2", "github.com/deltabox/deltabox/orchestrator/api", "github.com/deltabox/deltabox/orchestrator/client"}
	deps := strings.Fields(string(out))
	for _, h := range heavy {
		for _, pkg := range deps {
			if pkg == h {
				t.Errorf("the fast front links %s (see main.go: every call would pay its initialisers)", h)
			}
		}
	}
}

// The front's copies of the client's constants and error classes stay equal to them.
func TestClassesMatchAPI(t *testing.T) {
	if defaultAddress != client.DefaultAddress {
		t.Errorf("defaultAddress %q, client.DefaultAddress %q", defaultAddress, client.DefaultAddress)
	}
	if len(classes) != len(api.Classes) {
		t.Fatalf("%d classes, api has %d", len(classes), len(api.Classes))
	}
	for i, c := range api.Classes {
		if classes[i].code != c.Code || classes[i].err != c.Err || reflect.ValueOf(classes[i].is).Pointer() != reflect.ValueOf(c.Is).Pointer() {
			t.Errorf("class %d: %s %v, api has %s %v", i, classes[i].code, classes[i].err, c.Code, c.Err)
		}
	}
	for status := 100; status < 600; status++ { // errhttp.ToNative's mapping
		want := api.ToErrorStatus(api.Error{Code: "?"}, status)
		if got := statusClass(status); !errors.Is(want, got) && !(got == errdefs.ErrUnknown && errdefs.IsUnknown(want)) {
			t.Errorf("status %d: the front's class %v, the client's %v", status, got, errors.Unwrap(want))
		}
	}
}

// Errors print as deltabox-cli prints them (cmd/deltabox/output.go).
func TestPrintError(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{apiError("not_found", `sandbox "x": not found`, 404), "deltabox: not_found: sandbox \"x\"\n"},
		{apiError("conflict", `pool "p": already exists`, 409), "deltabox: conflict: pool \"p\"\n"},
		{apiError("internal", "boom", 500), "deltabox: boom\n"},
		{apiError("", "teapot", 418), "deltabox: unknown: teapot\n"},
		{&classError{msg: "plain"}, "deltabox: plain\n"},
	}
	for _, c := range cases {
		var b strings.Builder
		printError(&b, c.err)
		if b.String() != c.want {
			t.Errorf("printError(%v) = %q; want %q", c.err, b.String(), c.want)
		}
	}
}

// The front prints a -o json result by re-encoding the daemon's body (reencode); deltabox-cli
// decodes it into the API type and encodes that. Both must print the same bytes, for any
// value: strings that need escaping (or are not UTF-8), floats, times, empty and nil lists.
func TestReencodeMatchesEncodingJSON(t *testing.T) {
	zone := time.FixedZone("X", 5*3600+30*60)
	odd := "a <b> & \"c\" \\ \t\n\x01 \u2028 é \xff\xfe end"
	values := []any{
		api.Checkpoint{ID: "7", Sandbox: "sb-1", Level: "l1", Parent: "6", Message: odd, Name: "n1",
			Created: time.Date(2026, 12, 2, 13, 0, 0, 123456700, zone), StateSeq: 1 << 60, FilesChanged: 3, Bytes: 1 << 40,
			FrozenMS: 1.0 / 3, TotalMS: 1e-7, Pinned: true, Head: true, TemplateBytes: 5,
			Processes: []api.CheckpointProcess{{Pid: 1, Comm: "sh", Kept: "template"}, {Pid: 2, Comm: odd, Kept: "none", Reason: odd}}},
		api.Checkpoint{Created: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), FrozenMS: 1e21, TotalMS: 123456789.125},
		api.Checkpoint{Processes: []api.CheckpointProcess{}},
		api.RollbackResult{ID: "sb", To: "@", FilesRestored: 2, FrozenMS: 0.5, TotalMS: 12,
			ProcessesLost: []api.CheckpointProcess{{Pid: 9, Comm: "x", Kept: "none", Reason: odd}}},
		api.ExitStatus{Code: 137, Signal: "SIGKILL", TimedOut: true, StdoutTruncated: true, Error: odd, Pid: 3, DurationMS: 2.5e-5},
		api.ExitStatus{},
		api.Lease{LeaseMS: 0.25},
		[]map[string]string{{"released": "a"}, {"released": odd}},
		[]map[string]string{},
	}
	for _, v := range values {
		var body bytes.Buffer // the daemon's writeJSON
		if err := json.NewEncoder(&body).Encode(v); err != nil {
			t.Fatal(err)
		}
		for _, indent := range []bool{true, false} {
			decoded := reflect.New(reflect.TypeOf(v)) // the CLI's decode and printResult
			if err := json.Unmarshal(body.Bytes(), decoded.Interface()); err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			enc := json.NewEncoder(&want)
			if indent {
				enc.SetIndent("", "  ")
			}
			if err := enc.Encode(decoded.Elem().Interface()); err != nil {
				t.Fatal(err)
			}
			got, err := reencode(nil, body.Bytes(), indent)
			if err != nil || string(got)+"\n" != want.String() {
				t.Errorf("reencode(%s, indent %v) = %q, %v\nwant %q", body.Bytes(), indent, got, err, want.String())
			}
		}
	}
}
