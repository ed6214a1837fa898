package integration

import (
	"strings"
	"testing"
)

// TestPythonImageHasGitAndPip: the default python image has what coding agents reach for
// (hack/images.sh): git that can commit, pip that installs system-wide.
func TestPythonImageHasGitAndPip(t *testing.T) {
	d := startDaemon(t)
	d.createPool("tools", pythonImage, 1)
	l := d.lease("tools")
	if out := d.cli("exec", l.ID, "git", "--version"); !strings.HasPrefix(out, "git version ") {
		t.Fatalf("git --version: %q", out)
	}
	out := d.cli("exec", l.ID, "sh", "-c", "cd /tmp && git init -q r && cd r && echo hi > f && git add f && "+
		"git -c user.email=agent@example.invalid -c user.name=agent commit -qm first && git log --format=%s")
	if strings.TrimSpace(out) != "first" {
		t.Fatalf("git commit in the sandbox: %q", out)
	}
	if out := d.cli("exec", l.ID, "pip", "--version"); !strings.HasPrefix(out, "pip ") {
		t.Fatalf("pip --version: %q", out)
	}
	if out := d.cli("exec", l.ID, "pip", "config", "list"); !strings.Contains(out, "break-system-packages") {
		t.Fatalf("pip installs into the externally managed system python only with break-system-packages: %q", out)
	}
}
