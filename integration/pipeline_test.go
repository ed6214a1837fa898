package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// pipelineResult is the part of a `deltabox run` result line the tests check.
type pipelineResult struct {
	Index       int    `json:"index"`
	ID          string `json:"id"`
	Line        int    `json:"line"`
	Status      string `json:"status"`
	Attempts    int    `json:"attempts"`
	Failures    int    `json:"failures"`
	Rollbacks   int    `json:"rollbacks"`
	Checkpoints int    `json:"checkpoints"`
	Commits     int    `json:"commits"`
	Effects     struct {
		Held, Committed, Dropped int
	} `json:"effects"`
	Steps []struct {
		Name     string `json:"name"`
		Status   string `json:"status"`
		Attempts int    `json:"attempts"`
	} `json:"steps"`
	Error string `json:"error"`
}

type pipelineSummary struct {
	Tasks, Skipped, Succeeded, Failed, Interrupted int
	Steps, Attempts, Failures, Rollbacks           int
	Checkpoints, Commits                           int
	Effects                                        struct{ Held, Committed, Dropped int }
	CheckpointMS                                   struct{ N int } `json:"checkpoint_ms"`
	RollbackMS                                     struct{ N int } `json:"rollback_ms"`
}

// runOutput is what `deltabox -o json run` printed: one line per task, then the summary.
type runOutput struct {
	results map[string]pipelineResult // by task ID
	summary pipelineSummary
	stderr  string
	code    int
}

// run runs `deltabox -o json run` and decodes its JSON lines.
func (d *daemon) runPipeline(args ...string) runOutput {
	d.t.Helper()
	out, errOut, code := d.cliRaw(append([]string{"-o", "json", "run"}, args...)...)
	ro := runOutput{results: map[string]pipelineResult{}, stderr: errOut, code: code}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var s struct {
			Summary *pipelineSummary `json:"summary"`
		}
		if err := json.Unmarshal([]byte(line), &s); err == nil && s.Summary != nil {
			ro.summary = *s.Summary
			continue
		}
		var r pipelineResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			d.t.Fatalf("run printed a line that is not JSON: %q (%v)\nstderr: %s", line, err, errOut)
		}
		ro.results[r.ID] = r
	}
	return ro
}

// pipelineSteps is a busybox pipeline: each step leaves a half-written file, fails on its first
// attempt when the task lists it in "fail", and otherwise finishes its file. A retry that
// still sees the half-written file fails for good: the rollback must have removed it.
const pipelineSteps = `name: it
pool: bb
seed: 5
steps:
  - name: s1
    script: &step |
      mkdir -p /work
      test ! -e /work/$DELTABOX_STEP.partial || { echo "partial file survived the rollback"; exit 9; }
      echo "$DELTABOX_SEED $DELTABOX_ATTEMPT" > /work/$DELTABOX_STEP.partial
      case ",$TASK_FAIL," in *",$DELTABOX_STEP,"*) [ "$DELTABOX_ATTEMPT" != 1 ] || exit 3 ;; esac
      mv /work/$DELTABOX_STEP.partial /work/$DELTABOX_STEP.out
    retry: {attempts: 2, backoff: 10ms}
    state:
      - {op: add, path: /done, value: []}
      - {op: append, path: /done, value: "{{.Task.id}}:s1"}
  - name: s2
    script: *step
    retry: {attempts: 2, backoff: 10ms}
    commit: step
  - name: s3
    script: *step
    retry: {attempts: 2, backoff: 10ms}
    state: [{op: append, path: /done, value: "{{.Task.id}}:s3"}]
  - name: verify
    script: |
      for s in s1 s2 s3; do test -f /work/$s.out || { echo "missing $s.out"; exit 1; }; done
      ! ls /work/*.partial 2>/dev/null
`

// writePipelineTasks writes n tasks; about rate of the steps s1..s3 fail once. It returns the
// tasks file and the injected failures per task ID.
func writePipelineTasks(t *testing.T, dir string, n int, rate float64) (string, map[string]int) {
	rng := rand.New(rand.NewPCG(7, 11))
	fails := map[string]int{}
	var b strings.Builder
	for i := range n {
		id := fmt.Sprintf("t%02d", i)
		var f []string
		for _, s := range []string{"s1", "s2", "s3"} {
			if rng.Float64() < rate {
				f = append(f, s)
			}
		}
		fails[id] = len(f)
		fmt.Fprintf(&b, `{"id":%q,"fail":%q,"n":%d}`+"\n", id, strings.Join(f, ","), i)
	}
	path := filepath.Join(dir, "tasks.jsonl")
	writeFile(t, path, b.String())
	return path, fails
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

func TestPipelineBatchRetryResume(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 4, "--max", "8")
	dir := t.TempDir()
	pipe := filepath.Join(dir, "it.yaml")
	writeFile(t, pipe, pipelineSteps)
	tasks, fails := writePipelineTasks(t, dir, 20, 0.25)
	results := filepath.Join(dir, "results.jsonl")

	ro := d.runPipeline(pipe, "--tasks", tasks, "--parallel", "4", "--results", results)
	if ro.code != 0 {
		t.Fatalf("run exited %d: %s\n%s", ro.code, ro.stderr, d.logTail())
	}
	injected := checkBatch(t, ro, fails)
	s := ro.summary
	if s.Tasks != 20 || s.Succeeded != 20 || s.Failures != injected || s.Rollbacks != injected ||
		s.Attempts != 80+injected || s.Checkpoints != 80 || s.CheckpointMS.N != 80 || s.RollbackMS.N != injected {
		t.Errorf("summary %+v, want 20 tasks, %d injected failures and rollbacks", s, injected)
	}
	// Effects stay 0 until the egress proxy is wired into the daemon. TODO: route the steps'
	// HTTP calls through the proxy to a loopback upstream and check that the upstream saw
	// exactly one POST per task (s.Effects.Committed == upstream count, dropped == injected).
	if s.Effects.Held != 0 {
		t.Errorf("effects still held after the run: %+v", s.Effects)
	}
	if n := countLines(t, results); n != 20 {
		t.Errorf("results file has %d lines, want 20", n)
	}
	d.checkNothingLeased()

	// Resume: everything is recorded as finished, nothing runs again.
	again := d.runPipeline(pipe, "--tasks", tasks, "--parallel", "4", "--results", results)
	if again.code != 0 || len(again.results) != 0 || again.summary.Skipped != 20 || again.summary.Checkpoints != 0 {
		t.Errorf("second run: exit %d, %d results, summary %+v", again.code, len(again.results), again.summary)
	}
	d.resumeAfterTornResults(pipe, tasks, results, fails)
}

// checkBatch checks every task line against the failures injected into it and returns their
// sum.
func checkBatch(t *testing.T, ro runOutput, fails map[string]int) int {
	t.Helper()
	total := 0
	for id, f := range fails {
		total += f
		r, ok := ro.results[id]
		switch {
		case !ok:
			t.Errorf("no result line for task %s", id)
		case r.Status != "succeeded" || r.Error != "":
			t.Errorf("task %s: %s: %s", id, r.Status, r.Error)
		case r.Attempts != 4+f || r.Failures != f || r.Rollbacks != f || r.Checkpoints != 4 || len(r.Steps) != 4:
			t.Errorf("task %s with %d injected failures: %+v", id, f, r)
		case r.Commits != 2: // s2 commits, the task's end commits s3 and verify
			t.Errorf("task %s: %d commits, want 2", id, r.Commits)
		}
	}
	return total
}

// resumeAfterTornResults cuts the results file as an interrupted run would (half the lines
// and a torn last one) and checks that the next run does exactly the missing tasks.
func (d *daemon) resumeAfterTornResults(pipe, tasks, results string, fails map[string]int) {
	t := d.t.(*testing.T)
	data, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	kept := strings.Join(lines[:12], "") + lines[12][:len(lines[12])/2]
	writeFile(t, results, kept)
	ro := d.runPipeline(pipe, "--tasks", tasks, "--parallel", "4", "--results", results)
	if ro.code != 0 || len(ro.results) != 8 || ro.summary.Skipped != 12 || ro.summary.Succeeded != 8 {
		t.Fatalf("resumed run: exit %d, %d results, summary %+v\n%s", ro.code, len(ro.results), ro.summary, ro.stderr)
	}
	for id, r := range ro.results {
		if strings.Contains(kept, fmt.Sprintf(`"id":%q,`, id)) && !strings.Contains(lines[12], id) {
			t.Errorf("task %s was finished but ran again", id)
		}
		if r.Rollbacks != fails[id] {
			t.Errorf("resumed task %s: %d rollbacks, want %d", id, r.Rollbacks, fails[id])
		}
	}
	done, _ := os.ReadFile(results)
	seen := map[int]bool{}
	for _, line := range strings.Split(string(done), "\n") {
		var r pipelineResult
		if json.Unmarshal([]byte(line), &r) == nil && r.Status == "succeeded" {
			seen[r.Index] = true
		}
	}
	if len(seen) != 20 {
		t.Errorf("results file records %d finished tasks after the resume, want 20", len(seen))
	}
}

func (d *daemon) checkNothingLeased() {
	d.t.Helper()
	sbs, err := d.client().Sandboxes(context.Background())
	if err != nil || len(sbs) != 0 {
		d.t.Errorf("after the run: %d sandboxes still leased (%v)", len(sbs), err)
	}
}

// leaseCount counts the leases the daemon logged.
func (d *daemon) leaseCount() int { return strings.Count(d.logs.String(), "sandbox leased") }

func TestPipelineBadInput(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	dir := t.TempDir()
	cases := []struct{ name, yaml, want string }{
		{"unknown field", "pool: bb\nsteps:\n  - name: a\n    script: \"true\"\n    retires: 2\n", `bad.yaml:5: unknown field "retires" in a step`},
		{"no command", "pool: bb\nsteps:\n  - name: a\n    script: \"true\"\n  - name: b\n    env: {A: b}\n", `bad.yaml:5: step "b" has no command`},
		{"missing pool", "pool: nope\nsteps:\n  - script: \"true\"\n", `pool "nope"`},
	}
	for _, c := range cases {
		path := filepath.Join(dir, "bad.yaml")
		writeFile(t, path, c.yaml)
		before := d.leaseCount()
		out, errOut, code := d.cliRaw("run", path)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q, want 1 and %q (stdout %q)", c.name, code, errOut, c.want, out)
		}
		if n := d.leaseCount(); n != before {
			t.Errorf("%s: %d sandboxes were leased before the pipeline was rejected", c.name, n-before)
		}
	}

	// A task line that is not JSON fails that task only; the others run.
	pipe := filepath.Join(dir, "ok.yaml")
	writeFile(t, pipe, "pool: bb\nsteps:\n  - script: 'echo {{.Task.id}} > /tmp/id'\n")
	tasks := filepath.Join(dir, "tasks.jsonl")
	writeFile(t, tasks, "{\"id\":\"a\"}\n{\"id\": oops}\n{\"id\":\"c\"}\n")
	ro := d.runPipeline(pipe, "--tasks", tasks, "--parallel", "2")
	bad := ro.results["1"]
	if ro.code != 1 || ro.results["a"].Status != "succeeded" || ro.results["c"].Status != "succeeded" ||
		bad.Status != "failed" || !strings.Contains(bad.Error, "tasks.jsonl:2:") || bad.Line != 2 {
		t.Errorf("exit %d, results %+v, stderr %s", ro.code, ro.results, ro.stderr)
	}
	if ro.summary.Succeeded != 2 || ro.summary.Failed != 1 {
		t.Errorf("summary %+v", ro.summary)
	}
	d.checkNothingLeased()
}

// TestPipelineExample runs examples/agent-pipeline.yaml (a Python agent with a local HTTP API,
// agent state through the sandbox socket and transient failures) on two tasks.
func TestPipelineExample(t *testing.T) {
	d := startDaemon(t)
	d.createPool("py", pythonImage, 2)
	_, self, _, _ := runtime.Caller(0)
	example := filepath.Join(filepath.Dir(self), "..", "examples", "agent-pipeline.yaml")
	dir := t.TempDir()
	tasks := filepath.Join(dir, "tasks.jsonl")
	writeFile(t, tasks, `{"id":"q1","question":"what is a checkpoint?"}`+"\n"+`{"id":"q2","question":"why roll back?"}`+"\n")
	ro := d.runPipeline(example, "--tasks", tasks, "--parallel", "2", "--log-dir", filepath.Join(dir, "logs"))
	if ro.code != 0 || ro.summary.Succeeded != 2 {
		t.Fatalf("exit %d, summary %+v, results %+v\nstderr: %s", ro.code, ro.summary, ro.results, ro.stderr)
	}
	if ro.summary.Rollbacks != ro.summary.Failures {
		t.Errorf("every failed attempt should be rolled back once: %+v", ro.summary)
	}
}
