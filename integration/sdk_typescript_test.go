package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// npmBuild installs the pinned npm dependencies of the TypeScript packages in dirs (relative
// to the repository) from npm's cache or registry and builds them (hack/npm.sh); the
// absolute directories.
func npmBuild(t testing.TB, dirs ...string) []string {
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
	cmd := exec.Command("bash", append([]string{"hack/npm.sh"}, abs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/npm.sh: %v\n%s", err, out)
	}
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
	d := egressDaemon(t, u, pythonImage, 2, "")
	rec, recAddr := startRecorder(t, d.address)
	env := []string{"DELTABOX_ADDRESS=" + recAddr, "DELTABOX_TEST_POOL=net", "DELTABOX_TEST_UPSTREAM=" + u.plain.URL}
	out := runTool(t, sdk, env, "node", "--test", "test/offline.test.mjs", "test/daemon.test.mjs")
	passed := nodeTestSummary(t, "sdk/typescript", out)
	answers, routes := checkSDKTraffic(t, u, rec)
	t.Logf("%s tests passed; %d answers on %d routes validated against docs/api/openapi.yaml", passed, answers, routes)

	js := compileTSExample(t, sdk, "agent_loop.ts")
	out = runTool(t, filepath.Dir(js), []string{"DELTABOX_ADDRESS=" + d.address}, "node", js, "--pool", "net")
	mustContain(t, "examples/agent_loop.ts", out, "count: attempt 1 failed (count: exit 3); rolled back",
		"count: ok after 2 attempt(s)", `"1\n2\n3"`, "added /work/out.txt",
		`conversation: [["write the notes",1,0],["count",2,0],["check",1,0]]`)
	if strings.Contains(out, "out.partial") {
		t.Errorf("the failed attempt's out.partial survived its rollback:\n%s", out)
	}
}

// compileTSExample type-checks and compiles examples/NAME with the SDK's pinned TypeScript,
// resolving @deltabox/sdk to the built SDK (sdk); the path of the .js, next to a node_modules
// that links @deltabox/sdk so that Node resolves it too.
func compileTSExample(t *testing.T, sdk, name string) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tsconfig := fmt.Sprintf(`{"compilerOptions": {"target": "ES2022", "module": "ES2022", "moduleResolution": "Bundler",
  "strict": true, "noEmitOnError": true, "outDir": %q, "rootDir": %q, "types": ["node"],
  "typeRoots": [%q], "paths": {"@deltabox/sdk": [%q]}}, "files": [%q]}`,
		filepath.Join(dir, "out"), filepath.Dir(src), filepath.Join(sdk, "node_modules", "@types"),
		filepath.Join(sdk, "dist", "index.d.ts"), src)
	if err := os.WriteFile(filepath.Join(dir, "tsconfig.json"), []byte(tsconfig), 0o644); err != nil {
		t.Fatal(err)
	}
	// package.json "type": "module" makes the emitted .js ES modules, as the SDK's are.
	os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"type": "module"}`), 0o644)
	os.MkdirAll(filepath.Join(dir, "node_modules", "@deltabox"), 0o755)
	if err := os.Symlink(sdk, filepath.Join(dir, "node_modules", "@deltabox", "sdk")); err != nil {
		t.Fatal(err)
	}
	runTool(t, dir, nil, filepath.Join(sdk, "node_modules", ".bin", "tsc"), "-p", dir)
	return filepath.Join(dir, "out", strings.TrimSuffix(name, ".ts")+".js")
}
