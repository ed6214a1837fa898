package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCLIBuildIsLight keeps the daemon's dependencies out of the cli build (bin/deltabox), so
// that every client call does not pay their package initialisers (see lite.go). A verb that
// needs one of them goes in a `//go:build !cli` file, with a stub in a `cli` one.
func TestCLIBuildIsLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "cli", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -tags cli -deps: %v\n%s", err, out)
	}
	heavy := []string{
		"github.com/deltabox/deltabox/orchestrator", "github.com/deltabox/deltabox/pool",
		"github.com/deltabox/deltabox/proxy", "github.com/deltabox/deltabox/overlay",
		"github.com/deltabox/deltabox/criu", "github.com/deltabox/deltabox/objectstore",
		"github.com/containerd/containerd", "github.com/prometheus/", "google.golang.org/grpc",
		"github.com/minio/", "go.temporal.io/",
	}
	allowed := []string{"github.com/deltabox/deltabox/orchestrator/api", "github.com/deltabox/deltabox/orchestrator/client"}
	for _, pkg := range strings.Fields(string(out)) {
		if contains(allowed, pkg) {
			continue
		}
		for _, h := range heavy {
			if pkg == h || strings.HasPrefix(pkg, h+"/") || (strings.HasSuffix(h, "/") && strings.HasPrefix(pkg, h)) {
				t.Errorf("the cli build links %s (a daemon dependency): move the code that needs it behind //go:build !cli", pkg)
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
