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

// TestLangGraphTimeTravel runs sdk/langgraph/examples/time_travel.mjs: a LangGraph graph whose
// tool node runs commands in a sandbox is run, then resumed on another branch from the
// checkpoint after its first tool call; the sandbox's files must be those of that branch only.
func TestLangGraphTimeTravel(t *testing.T) {
	lg := npmBuild(t, "sdk/typescript", "sdk/langgraph")[1]
	d := startDaemon(t)
	d.createPool("lg", busyboxImage, 1, "--max", "4")
	env := []string{"DELTABOX_ADDRESS=" + d.address}
	out := runTool(t, lg, env, "node", "examples/time_travel.mjs", "--pool", "lg")
	t.Logf("examples/time_travel.mjs:\n%s", out)
	mustContain(t, "examples/time_travel.mjs", out,
		"files after run 1: b.txt c.txt\n",
		"files at the fork: a.txt\n", // c.txt and b.txt were made after that checkpoint; a.txt is back
		"$ echo alt > /work/alt.txt -> exit 0",
		"files after run 2: a.txt alt.txt\n",
		"files back at the end of run 1: b.txt c.txt\n", // the checkpoint tree keeps the other branch
		"pinned sandbox checkpoints (run starts): 1\n",  // pin: the input checkpoint of run 1 only
		"(both branches kept)")
}
