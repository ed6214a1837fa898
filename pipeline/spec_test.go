package pipeline

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

const goodPipeline = `name: demo
pool: bb
seed: 7
env: {MODE: "{{.Task.mode}}"}
steps:
  - name: fetch
    run: [echo, "{{.Task.q}}"]
    retry: {attempts: 3, backoff: 10ms}
    state:
      - {op: append, path: /log, value: "fetched {{.Task.q}}"}
  - name: think
    script: echo thinking
    checkpoint: l2
    on_failure: rollback_continue
    commit: step
    timeout: 5s
  - name: act
    script: exit 0
    on_failure: {fallback: apologise}
fallbacks:
  - name: apologise
    script: echo sorry
`

func TestParseGood(t *testing.T) {
	p, err := Parse("demo.yaml", []byte(goodPipeline))
	if err != nil {
		t.Fatal(err)
	}
	if p.SeedValue() != 7 || len(p.Steps) != 3 || len(p.Fallbacks) != 1 {
		t.Fatalf("unexpected pipeline: %+v", p)
	}
	fetch, think, act := p.Steps[0], p.Steps[1], p.Steps[2]
	if fetch.Line != 6 || think.Line != 11 || act.Line != 17 {
		t.Errorf("step lines %d %d %d, want 6 11 17", fetch.Line, think.Line, act.Line)
	}
	if fetch.Retry.Attempts != 3 || fetch.Retry.Backoff != 10*time.Millisecond || fetch.Checkpoint != LevelL1 ||
		fetch.Commit != CommitTask || fetch.OnFailure.Action != OnFailureStop {
		t.Errorf("fetch defaults: %+v", fetch)
	}
	if think.Checkpoint != LevelL2 || think.Commit != CommitStep || think.Timeout != 5*time.Second ||
		think.OnFailure.Action != OnFailureRollbackContinue || think.Retry.Attempts != 1 {
		t.Errorf("think: %+v", think)
	}
	if act.fb != p.Fallbacks[0] {
		t.Errorf("act's fallback not linked")
	}
}

func TestParseDefaultsSeedAndName(t *testing.T) {
	p, err := Parse("/x/my-flow.yaml", []byte("pool: bb\nsteps:\n  - script: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.SeedValue() != 1 || p.DisplayName() != "my-flow" || p.Steps[0].Name != "step1" {
		t.Errorf("defaults: seed %d name %q step %q", p.SeedValue(), p.DisplayName(), p.Steps[0].Name)
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"unknown top-level field", "pool: bb\nsteps:\n  - script: true\nparalel: 3\n", `p.yaml:4: unknown field "paralel" in the pipeline`},
		{"unknown step field", "pool: bb\nsteps:\n  - name: a\n    script: true\n    retires: 3\n", `p.yaml:5: unknown field "retires" in a step`},
		{"unknown retry field", "pool: bb\nsteps:\n  - script: true\n    retry: {attempt: 3}\n", `p.yaml:4: unknown field "attempt" in retry`},
		{"no command", "pool: bb\nsteps:\n  - name: a\n    script: true\n  - name: b\n    env: {A: b}\n", `p.yaml:5: step "b" has no command`},
		{"run and script", "pool: bb\nsteps:\n  - name: a\n    script: true\n    run: [true]\n", `p.yaml:3: step "a" has both run and script`},
		{"bad policy", "pool: bb\nsteps:\n  - script: true\n    on_failure: retry\n", `p.yaml:4: on_failure: want stop`},
		{"missing fallback", "pool: bb\nsteps:\n  - script: true\n    on_failure: {fallback: nope}\n", `p.yaml:4: step "step1" falls back to "nope", which is no step`},
		{"bad level", "pool: bb\nsteps:\n  - script: true\n    checkpoint: l3\n", `p.yaml:3: step "step1": checkpoint "l3"`},
		{"bad duration", "pool: bb\nsteps:\n  - script: true\n    timeout: 30\n", `p.yaml:4: cannot unmarshal`},
		{"bad template", "pool: bb\nsteps:\n  - script: 'echo {{.Task.x'\n", `p.yaml:3: step "step1"`},
		{"duplicate name", "pool: bb\nsteps:\n  - {name: a, script: x}\n  - {name: a, script: y}\n", `p.yaml:4: step name "a" is used twice`},
		{"no pool", "steps:\n  - script: x\n", `p.yaml:1: the pipeline names no pool`},
		{"bad commit", "pool: bb\ncommit: always\nsteps:\n  - script: x\n", `commit "always"`},
		{"not yaml", "pool: [\n", `p.yaml: `},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("error %v is not InvalidArgument", err)
			}
		})
	}
}

func TestTemplates(t *testing.T) {
	p, err := Parse("p.yaml", []byte(goodPipeline))
	if err != nil {
		t.Fatal(err)
	}
	data := TemplateData{Task: map[string]any{"q": "it's", "mode": "fast"}, Step: "fetch"}
	argv, _ := p.Steps[0].argv(data)
	if strings.Join(argv, " ") != "echo it's" {
		t.Errorf("argv %q", argv)
	}
	env, _ := p.Steps[0].env(data)
	if strings.Join(env, " ") != "MODE=fast" {
		t.Errorf("env %q", env)
	}
	ops, err := p.Steps[0].statePatch(data)
	if err != nil || string(ops) != `[{"op":"append","path":"/log","value":"fetched it's"}]` {
		t.Errorf("state %s, %v", ops, err)
	}
	if _, err := p.Steps[0].argv(TemplateData{Task: map[string]any{}}); err == nil {
		t.Errorf("a missing task field should fail the render")
	}
}

func TestStateAsTemplatedText(t *testing.T) {
	src := "pool: bb\nsteps:\n  - script: 'echo {{sh .Task.q}}'\n    state: '[{\"op\":\"add\",\"path\":\"/n\",\"value\":{{json .Task.n}}}]'\n"
	p, err := Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	data := TemplateData{Task: map[string]any{"q": "a'b", "n": 42}}
	ops, err := p.Steps[0].statePatch(data)
	if err != nil || string(ops) != `[{"op":"add","path":"/n","value":42}]` {
		t.Errorf("state %s, %v", ops, err)
	}
	argv, _ := p.Steps[0].argv(data)
	if argv[2] != `echo 'a'\''b'` {
		t.Errorf("sh quoting: %q", argv[2])
	}
}
