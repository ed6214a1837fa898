package pipeline

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

func mustParse(t *testing.T, src string) *Pipeline {
	t.Helper()
	p, err := Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustTasks(t *testing.T, lines string) []Task {
	t.Helper()
	tasks, err := ReadTasks(strings.NewReader(lines), "tasks.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}

// failOnce fails the first attempt of the steps named in the task's "fail" field.
func failOnce(sb *fakeSandbox, argv []string, env map[string]string) int {
	if strings.Contains(","+env["TASK_FAIL"]+",", ","+env["DELTABOX_STEP"]+",") && env["DELTABOX_ATTEMPT"] == "1" {
		return 3
	}
	return 0
}

const threeSteps = `pool: bb
steps:
  - {name: s1, script: "true", retry: {attempts: 2}, state: [{op: add, path: /s1, value: "{{.ID}}"}]}
  - {name: s2, script: "true", retry: {attempts: 2}}
  - {name: s3, script: "true", retry: {attempts: 2}}
`

func TestRunRetriesRollBackAndCommitOnce(t *testing.T) {
	f := newFake(failOnce)
	tasks := mustTasks(t, `{"id":"a","fail":"s2"}`+"\n\n"+`{"id":"b","fail":"s1,s3"}`+"\n"+`{"id":"c"}`+"\n")
	var mu sync.Mutex
	results := map[string]Result{}
	sum, err := Run(context.Background(), f, mustParse(t, threeSteps), tasks, Options{Parallel: 2, OnResult: func(r Result) error {
		mu.Lock()
		defer mu.Unlock()
		results[r.ID] = r
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Succeeded != 3 || sum.Failed != 0 || sum.Failures != 3 || sum.Rollbacks != 3 || sum.Attempts != 12 ||
		sum.Checkpoints != 9 || sum.Commits != 3 || sum.Steps != 9 {
		t.Errorf("summary: %+v", sum)
	}
	if b := results["b"]; b.Attempts != 5 || b.Rollbacks != 2 || b.Steps[0].Attempts != 2 || b.Steps[1].Attempts != 1 || b.Line != 3 {
		t.Errorf("task b: %+v", b)
	}
	if sum.CheckpointMS.N != 9 || sum.RollbackMS.N != 3 || sum.Effects.Committed != 3 || sum.Effects.Dropped != 3 {
		t.Errorf("latencies/effects: %+v %+v %+v", sum.CheckpointMS, sum.RollbackMS, sum.Effects)
	}
	for _, sb := range f.all {
		if !sb.released || sb.commits != 1 || len(sb.patches) != 1 {
			t.Errorf("sandbox %s: released %t commits %d patches %q", sb.id, sb.released, sb.commits, sb.patches)
		}
	}
}

func TestSameSeedOnEveryAttempt(t *testing.T) {
	f := newFake(failOnce)
	p := mustParse(t, threeSteps+"  - {name: s4, script: x, fresh_random: true, retry: {attempts: 2}}\n")
	if _, err := Run(context.Background(), f, p, mustTasks(t, `{"fail":"s1,s4"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	execs := f.all[0].execs
	if len(execs) != 6 {
		t.Fatalf("%d execs, want 6", len(execs))
	}
	if a, b := execs[0], execs[1]; a["DELTABOX_SEED"] != b["DELTABOX_SEED"] || a["PYTHONHASHSEED"] != a["DELTABOX_SEED"] ||
		a["DELTABOX_TASK_START"] != b["DELTABOX_TASK_START"] || a["DELTABOX_ATTEMPT"] != "1" || b["DELTABOX_ATTEMPT"] != "2" {
		t.Errorf("retry of s1 saw different inputs: %v vs %v", a, b)
	}
	if a, b := execs[4], execs[5]; a["DELTABOX_SEED"] == b["DELTABOX_SEED"] || a["DELTABOX_SEED"] == execs[0]["DELTABOX_SEED"] {
		t.Errorf("fresh_random attempts share a seed: %s %s", a["DELTABOX_SEED"], b["DELTABOX_SEED"])
	}
	if msg := f.all[0].messages[0]; !strings.Contains(msg, "seed "+execs[0]["DELTABOX_SEED"]) {
		t.Errorf("checkpoint message %q does not record the seed", msg)
	}
	if execs[0]["DELTABOX_TASK"] != `{"fail":"s1,s4"}` || execs[0]["TASK_FAIL"] != "s1,s4" {
		t.Errorf("task env: %v", execs[0])
	}
}

func TestStopFailsTaskAndRollsBackToFirstUncommitted(t *testing.T) {
	src := `pool: bb
steps:
  - {name: s1, script: ok, commit: step}
  - {name: s2, script: ok}
  - {name: s3, script: bad}
  - {name: s4, script: ok}
`
	f := newFake(func(_ *fakeSandbox, argv []string, _ map[string]string) int {
		if argv[2] == "bad" {
			return 1
		}
		return 0
	})
	sum, err := Run(context.Background(), f, mustParse(t, src), []Task{EmptyTask()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sb := f.all[0]
	// Checkpoints: 1 = lease, 2 = s1 (committed), 3 = s2, 4 = s3.
	if sum.Failed != 1 || sum.Rollbacks != 2 || strings.Join(sb.rollTo, ",") != "4,3" || sb.commits != 1 || len(f.all[0].execs) != 3 {
		t.Errorf("summary %+v, rollbacks to %v, commits %d", sum, sb.rollTo, sb.commits)
	}
}

func TestRollbackContinueAndFallback(t *testing.T) {
	src := `pool: bb
steps:
  - {name: s1, script: bad, on_failure: rollback_continue}
  - {name: s2, script: bad, retry: {attempts: 2}, on_failure: {fallback: fix}}
  - {name: s3, script: ok}
fallbacks:
  - {name: fix, script: ok}
`
	f := newFake(func(_ *fakeSandbox, argv []string, _ map[string]string) int {
		if argv[2] == "bad" {
			return 1
		}
		return 0
	})
	var res Result
	sum, err := Run(context.Background(), f, mustParse(t, src), []Task{EmptyTask()}, Options{OnResult: func(r Result) error { res = r; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range res.Steps {
		got = append(got, s.Name+":"+s.Status+s.FallbackFor)
	}
	if want := "s1:rolled_back s2:recovered fix:succeededs2 s3:succeeded"; strings.Join(got, " ") != want || sum.Succeeded != 1 {
		t.Errorf("steps %q, want %q (summary %+v)", got, want, sum)
	}
	if res.Rollbacks != 3 || res.Failures != 3 || res.Checkpoints != 4 {
		t.Errorf("result %+v", res)
	}
}

func TestBadTaskLineFailsOnlyThatTask(t *testing.T) {
	f := newFake(failOnce)
	tasks := mustTasks(t, "{\"id\":\"ok\"}\nnot json\n[1,2]\n{\"id\":\"ok2\"}\n")
	var lines []Result
	sum, err := Run(context.Background(), f, mustParse(t, threeSteps), tasks, Options{OnResult: func(r Result) error { lines = append(lines, r); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Succeeded != 2 || sum.Failed != 2 || len(f.all) != 2 {
		t.Fatalf("summary %+v, %d leases", sum, len(f.all))
	}
	for _, r := range lines {
		if r.Status == StatusFailed && !strings.Contains(r.Error, "tasks.jsonl:") {
			t.Errorf("bad line error does not name the line: %q", r.Error)
		}
	}
}

func TestMissingPoolLeasesNothing(t *testing.T) {
	f := newFake(failOnce)
	p := mustParse(t, strings.Replace(threeSteps, "pool: bb", "pool: nope", 1))
	_, err := Run(context.Background(), f, p, []Task{EmptyTask()}, Options{})
	if !errdefs.IsNotFound(err) || len(f.all) != 0 {
		t.Fatalf("got %v and %d leases", err, len(f.all))
	}
}

func TestResumeSkipsFinished(t *testing.T) {
	f := newFake(failOnce)
	tasks := mustTasks(t, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n")
	done, _ := readFinished(strings.NewReader(`{"index":0,"id":"a","status":"succeeded"}
{"index":1,"id":"b","status":"interrupted"}
{"summary":{"tasks":3}}
{"index":2,"id":"c","status":"fail`))
	sum, err := Run(context.Background(), f, mustParse(t, threeSteps), tasks, Options{Done: done})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Skipped != 1 || sum.Succeeded != 2 || len(f.all) != 2 {
		t.Errorf("summary %+v, %d leases", sum, len(f.all))
	}
}

func TestParallelWaitsForSandboxes(t *testing.T) {
	f := newFake(failOnce)
	f.max = 2
	tasks := mustTasks(t, strings.Repeat("{}\n", 8))
	sum, err := Run(context.Background(), f, mustParse(t, threeSteps), tasks, Options{Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Succeeded != 8 || f.maxLease > 2 || f.maxLease < 1 || len(f.leased) != 0 {
		t.Errorf("summary %+v, at most %d leased, %d still leased", sum, f.maxLease, len(f.leased))
	}
}

func TestCancelledRunReportsInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := newFake(func(sb *fakeSandbox, argv []string, env map[string]string) int {
		cancel()
		return 1
	})
	tasks := mustTasks(t, "{}\n{}\n{}\n")
	sum, err := Run(ctx, f, mustParse(t, threeSteps), tasks, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Interrupted != 3 || sum.Succeeded+sum.Failed != 0 || len(f.leased) != 0 {
		t.Errorf("summary %+v, %d still leased", sum, len(f.leased))
	}
}
