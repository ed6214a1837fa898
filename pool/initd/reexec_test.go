//go:build linux

package initd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/pool/initproto"
)

// TestResumeHandsOverDetachedExecs: a server started with the state an earlier image handed
// over (a detached exec still running, with the output it had produced and its pipe; one that
// had ended) serves them as its own: an attach from offset 0 gets the old window and the
// output written since, then the running one's exit status, reaped by the new server.
func TestResumeHandsOverDetachedExecs(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "read x; echo new; exit 4")
	cmd.Stdout, cmd.Stderr = w, w
	gate, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	rfd, err := unix.Dup(int(r.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	st := ResumeState{Detached: []resumeDetached{
		{Key: "running", Window: [2][]byte{[]byte("old\n"), nil}, Produced: [2]int64{4, 0},
			Running: &resumeProcess{Pid: cmd.Process.Pid, Argv: cmd.Args, Tag: "t", Started: time.Now(), Fds: [2]int{rfd, -1}}},
		{Key: "ended", Window: [2][]byte{[]byte("done\n"), nil}, Produced: [2]int64{5, 0},
			Exit: &initproto.ExitStatus{Code: 3}, Ended: time.Now()},
	}}
	// Through the memfd, as the init hands it over.
	data, _ := json.Marshal(st)
	fd, err := unix.MemfdCreate("resume-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, data); err != nil {
		t.Fatal(err)
	}
	got, err := ReadResume(fd)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "init.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := New(WithResume(got), WithKillTimeout(time.Second))
	go srv.Serve(ctx, l)
	c := initproto.New(sock)
	if _, err := c.WaitReady(ctx, 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	gate.Write([]byte("go\n"))
	var out bytes.Buffer
	es, err := c.Attach(ctx, "running", [2]int64{0, 0}, &out, &out)
	if err != nil || es.Code != 4 || out.String() != "old\nnew\n" {
		t.Fatalf("attach to the handed-over running exec: %+v %v, output %q", es, err, out.String())
	}
	out.Reset()
	es, err = c.Attach(ctx, "ended", [2]int64{0, 0}, &out, &out)
	if err != nil || es.Code != 3 || out.String() != "done\n" {
		t.Fatalf("attach to the handed-over ended exec: %+v %v, output %q", es, err, out.String())
	}
}
