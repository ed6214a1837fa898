package api

import (
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// daemonOnly lists what the client side of DeltaBox must never link: the containerd client,
// the pool's bbolt store, CNI and the daemon's packages (docs/architecture.md).
var daemonOnly = []string{
	"github.com/containerd/containerd",
	"go.etcd.io/bbolt",
	"github.com/containerd/go-cni",
	// and the daemon's own packages (orchestrator itself, not its api and client)
	"github.com/deltabox/deltabox/pool",
	"github.com/deltabox/deltabox/overlay",
	"github.com/deltabox/deltabox/criu",
	"github.com/deltabox/deltabox/proxy",
	"github.com/deltabox/deltabox/objectstore",
}

// daemonPackage reports whether dep is daemon-only.
func daemonPackage(dep string) bool {
	if dep == "github.com/deltabox/deltabox/orchestrator" {
		return true
	}
	for _, d := range daemonOnly {
		if dep == d || strings.HasPrefix(dep, d+"/") {
			return true
		}
	}
	return false
}

// cliDaemonFiles are the files of cmd/deltabox that run the daemon; every other file of the
// CLI is a client of the API.
var cliDaemonFiles = map[string]bool{"daemon.go": true, "e2b.go": true}

func TestClientSideDoesNotLinkTheDaemon(t *testing.T) {
	pkgs := []string{
		"github.com/deltabox/deltabox/orchestrator/api",
		"github.com/deltabox/deltabox/orchestrator/client",
		"github.com/deltabox/deltabox/pipeline",
		// `deltabox run --engine temporal` is a Temporal client; the daemon's worker uses
		// the node's API like any client, so the package links no daemon-side code either.
		"github.com/deltabox/deltabox/pipeline/temporal",
	}
	pkgs = append(pkgs, cliClientImports(t)...)
	slices.Sort(pkgs)
	for _, pkg := range slices.Compact(pkgs) {
		var bad []string
		for _, dep := range goListDeps(t, pkg) {
			if daemonPackage(dep) {
				bad = append(bad, dep)
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s links %d daemon-only packages, such as %s", pkg, len(bad), bad[0])
		}
	}
}

// cliClientImports returns the module's packages imported by the client files of the CLI.
func cliClientImports(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../cmd/deltabox/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CLI sources found: %v", err)
	}
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || cliDaemonFiles[filepath.Base(f)] || daemonBuildOnly(t, f) {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, ".") && !seen[p] { // not the standard library
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// daemonBuildOnly reports whether file f is left out of the CLI's client build (`//go:build
// !cli`, cmd/deltabox/lite.go): such files run in deltabox-daemon only, as daemon.go does.
func daemonBuildOnly(t *testing.T, f string) bool {
	t.Helper()
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "package ") {
			return false
		}
		if expr, err := constraint.Parse(line); err == nil {
			return !expr.Eval(func(tag string) bool { return tag == "cli" || tag == "linux" || tag == "amd64" })
		}
	}
	return false
}

func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}
