package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestCLIBuildIsLight keeps the daemon's dependencies out of the cli build (bin/deltabox), so
// that every client call does not pay their package initialisers (see lite.go). A verb that
// needs one of them goes in a `//go:build !cli` file, with a stub in a `cli` one.
func TestCLIBuildIsLight(t *testing.T) {
	cmd := exec.Command("go", "list", "-tags", "cli,urfave_cli_no_docs", "-deps", ".") // as make build builds it
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -tags cli,urfave_cli_no_docs -deps: %v\n%s", err, out)
	}
	heavy := []string{
		"github.com/deltabox/deltabox/orchestrator", "github.com/deltabox/deltabox/pool",
		"github.com/deltabox/deltabox/proxy", "github.com/deltabox/deltabox/overlay",
		"github.com/deltabox/deltabox/criu", "github.com/deltabox/deltabox/objectstore",
		"github.com/containerd/containerd", "github.com/prometheus/", "google.golang.org/grpc",
		"github.com/minio/", "go.temporal.io/",
		// Not the daemon's, but paid by every call for verbs and formats handed over to the
		// full build instead (lite_cli.go): -o yaml, `run`, `config`, and urfave/cli's man pages.
		"gopkg.in/yaml.v3", "github.com/BurntSushi/toml", "github.com/deltabox/deltabox/pipeline",
		"github.com/deltabox/deltabox/internal/config", "github.com/cpuguy83/go-md2man", "github.com/russross/blackfriday",
	}
	allowed := []string{"github.com/deltabox/deltabox/orchestrator/api", "github.com/deltabox/deltabox/orchestrator/client"}
	if !contains(strings.Fields(string(out)), "github.com/deltabox/deltabox/internal/oneproc") {
		t.Errorf("the cli build does not link internal/oneproc (one P: fewer page faults per call)")
	}
	for _, pkg := range strings.Fields(string(out)) {
		if contains(allowed, pkg) {
			continue
		}
		for _, h := range heavy {
			if pkg == h || strings.HasPrefix(pkg, h+"/") || (strings.HasSuffix(h, "/") && strings.HasPrefix(pkg, h)) {
				t.Errorf("the cli build links %s: move the code that needs it behind //go:build !cli (lite.go)", pkg)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The cli build hands -o yaml and the verbs it does not link (daemon, policy, config, run)
// over to deltabox-daemon next to it, with the command line unchanged; other command lines
// run in the cli build itself, and a missing deltabox-daemon is named.
func TestCLIBuildHandsOver(t *testing.T) {
	if testing.Short() {
		testutil.SkipOrFail(t, "builds the cli binary (-short)") // CI runs without -short: a skip there fails
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "deltabox")
	build := exec.Command("go", "build", "-tags", "cli,urfave_cli_no_docs", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the cli binary: %v\n%s", err, out)
	}
	run := func(args ...string) (string, string) {
		var out, errOut strings.Builder
		c := exec.Command(bin, args...)
		c.Stdout, c.Stderr = &out, &errOut
		_ = c.Run()
		return out.String(), errOut.String()
	}
	if _, errOut := run("-o", "yaml", "version"); !strings.Contains(errOut, "-o yaml runs deltabox-daemon, which should be installed next to") {
		t.Errorf("-o yaml without deltabox-daemon: stderr %q; want it named", errOut)
	}
	fake := "#!/bin/sh\necho \"full:$*\"\n"
	if err := os.WriteFile(filepath.Join(dir, "deltabox-daemon"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	handed := [][]string{
		{"-o", "yaml", "version"}, {"inspect", "sb-1", "-o", "yaml"}, {"--output=yaml", "ls"}, {"ls", "-o=yaml"},
		{"daemon", "--config", "x.toml"}, {"policy", "check", "p.yaml"}, {"config", "default"}, {"run", "p.yaml", "-p", "2"},
		{"help", "run"},
	}
	for _, args := range handed {
		if out, errOut := run(args...); out != "full:"+strings.Join(args, " ")+"\n" {
			t.Errorf("deltabox %s: stdout %q stderr %q; want it handed over unchanged", strings.Join(args, " "), out, errOut)
		}
	}
	for _, args := range [][]string{{"-o", "json", "version"}, {"version"}, {"exec", "sb-1", "echo", "-o", "yaml"}} {
		if out, _ := run(args...); strings.Contains(out, "full:") {
			t.Errorf("deltabox %s was handed over: %q", strings.Join(args, " "), out)
		}
	}
}
