package pipeline

import (
	"errors"
	"testing"
)

func TestSummaryRecordKeepsTheFirstSinkError(t *testing.T) {
	var sum Summary
	var sinkErr error
	calls := 0
	sink := func(Result) error { calls++; return errors.New("disk full") }
	if sum.Record(Result{Index: 1, Status: StatusSucceeded}, sink, &sinkErr) {
		t.Fatal("Record with a failing sink did not stop the run")
	}
	if sum.Record(Result{Index: 2, Status: StatusFailed}, sink, &sinkErr) {
		t.Fatal("Record after a sink failure did not stop the run")
	}
	if calls != 1 || sinkErr == nil || sinkErr.Error() != "record result of task 1: disk full" {
		t.Errorf("sink called %d times, error %v; want once, the first task's", calls, sinkErr)
	}
	if sum.Succeeded != 1 || sum.Failed != 1 {
		t.Errorf("counted %d succeeded, %d failed; want both results counted", sum.Succeeded, sum.Failed)
	}
	if !sum.Record(Result{Index: 3, Status: StatusSucceeded}, nil, new(error)) {
		t.Error("Record without a sink stopped the run")
	}
}

func TestSummarySkipDone(t *testing.T) {
	var sum Summary
	tasks := []Task{{Index: 0, ID: "a"}, {Index: 1, ID: "b"}, {Index: 2, ID: "c"}}
	done := map[int]Result{0: {Index: 0, ID: "a"}, 1: {Index: 1, ID: "other"}}
	todo := sum.SkipDone(tasks, done)
	if len(todo) != 2 || todo[0].ID != "b" || todo[1].ID != "c" || sum.Skipped != 1 {
		t.Errorf("SkipDone = %+v, skipped %d; want b and c, 1 skipped (b's index was done for another ID)", todo, sum.Skipped)
	}
}
