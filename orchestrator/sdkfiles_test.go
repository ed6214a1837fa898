package orchestrator

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestInstallSDK(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "sdk-tmp-leftover"), 0o755)
	dir, err := installSDK(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"python/deltabox/__init__.py", "python/deltabox/__main__.py", "python/deltabox/py.typed", "bin/deltabox"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o222 != 0 {
			t.Errorf("%s is writable: %v", f, fi.Mode())
		}
	}
	if _, err := os.Stat(filepath.Join(root, "sdk-tmp-leftover")); err == nil {
		t.Error("a leftover temporary directory was kept")
	}
	again, err := installSDK(root)
	if err != nil || again != dir {
		t.Fatalf("second install: %s %v (first %s)", again, err, dir)
	}
	for _, c := range []struct{ env, want string }{
		{"", "PYTHONPATH=/.deltabox/sdk/python"},
		{"PYTHONPATH=", "PYTHONPATH=/.deltabox/sdk/python"},
		{"PYTHONPATH=/app", "PYTHONPATH=/app:/.deltabox/sdk/python"},
	} {
		s := &oci.Spec{Process: &specs.Process{}}
		if c.env != "" {
			s.Process.Env = []string{c.env}
		}
		for _, o := range sdkSpec(dir) {
			if err := o(context.Background(), nil, nil, s); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Join(s.Process.Env, " "); got != c.want {
			t.Errorf("env %q: got %q, want %q", c.env, got, c.want)
		}
		if len(s.Mounts) != 1 || s.Mounts[0].Destination != "/.deltabox/sdk" || s.Mounts[0].Source != dir ||
			!strings.Contains(strings.Join(s.Mounts[0].Options, ","), "ro") {
			t.Errorf("mounts: %+v", s.Mounts)
		}
	}
}
