//go:build linux

package initd

import (
	"os"
	"testing"
	"time"
)

// TestDrainWaitsForUnreadOutput: a pump that has not read since the command wrote (its
// goroutine not scheduled, busy false) is not idle while output waits in the pipe, nor while
// the pipe's end (all writers gone) is unread; with an empty pipe held open by a background
// process it is.
func TestDrainWaitsForUnreadOutput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := &pump{f: r, done: make(chan struct{})} // no goroutine: as if never scheduled
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Minute)
	if !p.wait(past, future) {
		t.Fatal("empty pipe held open: the pump should count as idle")
	}
	if _, err := w.Write([]byte(`{"held":true}`)); err != nil {
		t.Fatal(err)
	}
	if p.wait(past, future) {
		t.Fatal("output waiting in the pipe was given up: the command's last output would be cut")
	}
	buf := make([]byte, 64)
	r.Read(buf)
	w.Close()
	if p.wait(past, future) {
		t.Fatal("the pipe's end waiting unread was given up")
	}
	if !p.wait(past, time.Now().Add(-time.Millisecond)) {
		t.Fatal("past the busy limit the pump must be given up")
	}
}
