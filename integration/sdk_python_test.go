package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestPythonSDK installs the Python SDK into a fresh venv with no package index (its build
// backend is in the tree) and runs its unittest suite (sdk/python/tests) against a real
// daemon whose pool holds writes to a local upstream. The suite's step() test sends one POST
// per attempt; only the committed attempt's may reach the upstream. Every answer the suite
// gets goes through a recorder and must match the schemas of docs/api/openapi.yaml.
func TestPythonSDK(t *testing.T) {
	python := testutil.RequiresBinary(t, "python3")
	sdk, err := filepath.Abs("../sdk/python")
	if err != nil {
		t.Fatal(err)
	}
	venv := filepath.Join(t.TempDir(), "venv")
	runTool(t, "", nil, python, "-m", "venv", venv)
	runTool(t, "", nil, filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-cache-dir", sdk)

	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 2, "")
	rec, recAddr := startRecorder(t, d.address) // every answer the suite gets is checked against the spec
	env := []string{"DELTABOX_ADDRESS=" + recAddr, "DELTABOX_TEST_POOL=net", "DELTABOX_TEST_UPSTREAM=" + u.plain.URL}
	// From a directory outside the tree, so that the venv's installed package is the one tested.
	out := runTool(t, t.TempDir(), env, filepath.Join(venv, "bin", "python"), "-m", "unittest", "discover", "-v",
		"-s", filepath.Join(sdk, "tests"))
	if strings.Contains(out, "skipped") {
		t.Fatalf("the SDK suite skipped tests that need the daemon:\n%s", out)
	}
	answers, routes := checkSDKTraffic(t, u, rec)
	t.Logf("%d answers on %d routes validated against docs/api/openapi.yaml", answers, routes)
	// The SDK mounted into every sandbox works in a user-namespaced one too (the default).
	d.createPool("uns", pythonImage, 1)
	id := d.lease("uns").ID
	if out := d.cli("exec", id, "--", "python3", "-c", "import deltabox; print(deltabox.inside().patch_state({'op': 'add', 'path': '/u', 'value': 1})['applied'])"); out != "1\n" {
		t.Fatalf("the mounted SDK in a user-namespaced sandbox: %q", out)
	}
	env[0] = "DELTABOX_ADDRESS=" + d.address
	example, err := filepath.Abs("../examples/agent_loop.py")
	if err != nil {
		t.Fatal(err)
	}
	out = runTool(t, t.TempDir(), env, filepath.Join(venv, "bin", "python"), example, "--pool", "net")
	mustContain(t, "examples/agent_loop.py", out, "count: attempt 1 failed (count: exit 3); rolled back",
		"count: ok after 2 attempt(s)", "'1\\n2\\n3'", "added /work/out.txt",
		`conversation: [["write the notes", 1, 0], ["count", 2, 0], ["check", 1, 0]]`)
	if strings.Contains(out, "out.partial") {
		t.Errorf("the failed attempt's out.partial survived its rollback:\n%s", out)
	}
}

// runTool runs a command in dir with extra environment and fails the test if it fails.
func runTool(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkSDKTraffic checks what an SDK's suite did through the recorder: the upstream saw one
// POST /step (the committed attempt's only), every answer matches the API spec, and the suite
// took at least 30 of the API's routes. It returns how many answers and routes it checked.
func checkSDKTraffic(t *testing.T, u *upstream, rec *recorder) (answers, routes int) {
	t.Helper()
	if n := u.count("POST /step"); n != 1 {
		t.Errorf("the upstream saw %d POST /step, want 1 (the committed attempt's only)", n)
	}
	xs := rec.exchanges(t)
	seen := checkAgainstSpec(t, xs)
	if len(seen) < 30 {
		t.Errorf("the SDK suite took only %d routes of the API: %v", len(seen), seen)
	}
	return len(xs), len(seen)
}
