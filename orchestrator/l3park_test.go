package orchestrator

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// pauseRig counts pauses and resumes and answers the socket check with the scripted lists.
type pauseRig struct {
	paused          bool
	pauses, resumes int
	answers         [][]string
	checkedPaused   bool
}

func (r *pauseRig) pause(context.Context) error  { r.pauses++; r.paused = true; return nil }
func (r *pauseRig) resume(context.Context) error { r.resumes++; r.paused = false; return nil }
func (r *pauseRig) sockets() ([]string, error) {
	r.checkedPaused = r.paused
	if len(r.answers) == 0 {
		return []string{"/.deltabox/run/init.sock"}, nil
	}
	a := r.answers[0]
	r.answers = r.answers[1:]
	return a, nil
}

// A host connection to the init still open when the task is paused for the dump (an exec's,
// still closing): the task is resumed so the init can close it, and paused again; the dump
// only starts once the paused init holds none.
func TestPauseParkedWaitsForHostConnectionsToClose(t *testing.T) {
	sock := []string{"/.deltabox/run/init.sock"}
	r := &pauseRig{answers: [][]string{sock, sock, nil}}
	if err := pauseParked(context.Background(), r.pause, r.resume, r.sockets); err != nil {
		t.Fatal(err)
	}
	if !r.paused || !r.checkedPaused || r.pauses != 3 || r.resumes != 2 {
		t.Fatalf("paused %v (checked while paused %v), %d pauses, %d resumes; want paused after 3 pauses and 2 resumes",
			r.paused, r.checkedPaused, r.pauses, r.resumes)
	}
}

// A connection that never closes (a sandbox process holding one to the init socket) makes
// the checkpoint fail after the bound, unavailable, with the task running again.
func TestPauseParkedGivesUpAfterTheBound(t *testing.T) {
	r := &pauseRig{}
	start := time.Now()
	err := pauseParked(context.Background(), r.pause, r.resume, r.sockets)
	if !errdefs.IsUnavailable(err) || r.paused {
		t.Fatalf("pauseParked = %v (paused %v), want unavailable with the task resumed", err, r.paused)
	}
	if took := time.Since(start); took < initParkTimeout || took > initParkTimeout+time.Second {
		t.Fatalf("gave up after %s, want about %s", took, initParkTimeout)
	}
}
