package pipeline

import (
	"strings"
	"testing"
)

func TestReadTasks(t *testing.T) {
	tasks := mustTasks(t, `{"id": 17, "q": "hi there", "n": 1.50, "ok": true, "nested": {"a": 1}, "user-name": "x"}`+"\n  \n{\"q\":\"b\"}\n{oops\n")
	if len(tasks) != 3 {
		t.Fatalf("%d tasks", len(tasks))
	}
	a := tasks[0]
	if a.ID != "17" || a.Line != 1 || a.Err != nil {
		t.Errorf("task 0: %+v", a)
	}
	env := strings.Join(a.Env(), "\n")
	for _, want := range []string{"TASK_ID=17", "TASK_Q=hi there", "TASK_N=1.50", "TASK_OK=true", "TASK_USER_NAME=x",
		`DELTABOX_TASK={"id":17,"q":"hi there","n":1.50,"ok":true,"nested":{"a":1},"user-name":"x"}`} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %q:\n%s", want, env)
		}
	}
	if strings.Contains(env, "TASK_NESTED") {
		t.Errorf("nested fields are not scalars: %s", env)
	}
	if b := tasks[1]; b.ID != "1" || b.Index != 1 || b.Line != 3 {
		t.Errorf("task 1: %+v", b)
	}
	if c := tasks[2]; c.Err == nil || !strings.Contains(c.Err.Error(), "tasks.jsonl:4:") {
		t.Errorf("task 2: %+v", c)
	}
}

func TestTaskSeed(t *testing.T) {
	first, again := TaskSeed(1, 0), TaskSeed(1, 0)
	if first != again {
		t.Fatal("seed is not deterministic")
	}
	seen := map[uint32]bool{}
	for seed := int64(1); seed <= 3; seed++ {
		for i := range 1000 {
			s := TaskSeed(seed, i)
			if s == 0 || seen[s] {
				t.Fatalf("seed %d index %d: %d is zero or repeated", seed, i, s)
			}
			seen[s] = true
		}
	}
}

func TestPercentiles(t *testing.T) {
	var v []float64
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}
	p := percentiles(v)
	if p.N != 100 || p.P50 != 50 || p.P99 != 99 || p.Max != 100 {
		t.Errorf("%+v", p)
	}
	if (percentiles(nil) != Percentiles{}) {
		t.Error("empty")
	}
}
