package integration

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// npmBuild installs the pinned npm dependencies of the TypeScript packages in dirs (relative
// to the repository) from npm's cache or registry and builds them (hack/npm.sh); the
// absolute directories.
func npmBuild(t *testing.T, dirs ...string) []string {
	t.Helper()
	testutil.RequiresBinary(t, "node")
	testutil.RequiresBinary(t, "npm")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	abs := make([]string, len(dirs))
	for i, d := range dirs {
		abs[i] = filepath.Join(root, d)
	}
	runTool(t, root, nil, "bash", append([]string{"hack/npm.sh"}, abs...)...)
	return abs
}

// nodeTestSummary fails the test unless node --test's output reports that every test ran
// and passed; the number that passed.
func nodeTestSummary(t *testing.T, what, out string) string {
	t.Helper()
	get := func(k string) string {
		m := regexp.MustCompile(`(?m)^# ` + k + ` (\d+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no %q in the output of node --test:\n%s", what, k, out)
		}
		return m[1]
	}
	if get("fail") != "0" || get("skipped") != "0" || get("cancelled") != "0" || get("pass") == "0" {
		t.Fatalf("%s: not every test passed:\n%s", what, out)
	}
	return get("pass")
}

// TestTypeScriptSDK builds the TypeScript SDK (sdk/typescript, typescript from npm) and runs
// its node --test suite against a real daemon whose pool holds writes to a local upstream.
// As for the Python SDK, only the committed attempt of the suite's step may reach the
// upstream, and every answer the suite gets must match docs/api/openapi.yaml.
func TestTypeScriptSDK(t *testing.T) {
	sdk := npmBuild(t, "sdk/typescript")[0]
	u := startUpstream(t)
	d := egressDaemon(t, u, pythonImage, 2, "", "--no-userns") // the suite snapshots, restores and forks (L3)
	rec, recAddr := startRecorder(t, d.address)
	env := []string{"DELTABOX_ADDRESS=" + recAddr, "DELTABOX_TEST_POOL=net", "DELTABOX_TEST_UPSTREAM=" + u.plain.URL}
	out := runTool(t, sdk, env, "node", "--test", "test/offline.test.mjs", "test/daemon.test.mjs")
	passed := nodeTestSummary(t, "sdk/typescript", out)
	if n := u.count("POST /step"); n != 1 {
		t.Errorf("the upstream saw %d POST /step, want 1 (the committed attempt's only)", n)
	}
	xs := rec.exchanges(t)
	seen := checkAgainstSpec(t, xs)
	if len(seen) < 30 {
		t.Errorf("the SDK suite took only %d routes of the API: %v", len(seen), seen)
	}
	t.Logf("%s tests passed; %d answers on %d routes validated against docs/api/openapi.yaml", passed, len(xs), len(seen))
}
