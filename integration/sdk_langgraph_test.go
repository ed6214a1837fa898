package integration

import (
	"path/filepath"
	"regexp"
	"testing"
)

// TestLangGraphCheckpointer builds @deltabox/langgraph (sdk/langgraph) and runs LangGraph's own
// conformance suite for checkpointers, @langchain/langgraph-checkpoint-validation's CLI
// validate-checkpointer, on it against a real daemon: each checkpointer of the suite is bound
// to a sandbox of its own.
func TestLangGraphCheckpointer(t *testing.T) {
	dirs := npmBuild(t, "sdk/typescript", "sdk/langgraph")
	lg := dirs[1]
	d := startDaemon(t)
	d.createPool("lg", busyboxImage, 2, "--max", "40")
	env := []string{"DELTABOX_ADDRESS=" + d.address, "DELTABOX_TEST_POOL=lg", "NO_COLOR=1", "CI=1"}
	out := runTool(t, lg, env, filepath.Join(lg, "node_modules", ".bin", "validate-checkpointer"), "./test/initializer.mjs")
	m := regexp.MustCompile(`(?m)Tests\s+(\d+) passed \((\d+)\)`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Fatalf("validate-checkpointer did not pass every test:\n%s", out)
	}
	t.Logf("LangGraph's checkpointer validation: %s of %s tests passed", m[1], m[2])
}
