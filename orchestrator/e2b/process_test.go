package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// openStream starts a server-streaming call and returns a function reading its next message
// (nil at the end of the stream).
func openStream(t *testing.T, srv *httptest.Server, c sandboxCreated, method string, req any) func() *processEventMsg {
	t.Helper()
	hreq, _ := http.NewRequest("POST", srv.URL+"/process.Process/"+method, bytes.NewReader(envelope(req)))
	hreq.Header.Set("Content-Type", "application/connect+json")
	hreq.Header.Set("E2b-Sandbox-Id", c.SandboxID)
	hreq.Header.Set("X-Access-Token", c.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	return func() *processEventMsg {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatalf("read frame: %v", err)
		}
		data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, data); err != nil {
			t.Fatal(err)
		}
		if hdr[0]&endStreamFlag != 0 {
			if string(data) != "{}" {
				t.Errorf("stream ended with %s", data)
			}
			return nil
		}
		var m processEventMsg
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		return &m
	}
}

// TestStdinConnectAndKill drives one process through two streams (Start and a second
// Connect), stdin, and a kill, under the race detector in make test.
func TestStdinConnectAndKill(t *testing.T) {
	f := newFake(t)
	f.exec = func(req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) api.ExitStatus {
		if stdin == nil {
			return api.ExitStatus{Code: 2}
		}
		io.Copy(stdout, stdin) // like cat: until stdin closes
		return api.ExitStatus{Code: 0}
	}
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	next := openStream(t, srv, c, "Start", map[string]any{"process": map[string]any{"cmd": "cat"}, "stdin": true, "tag": "mine"})
	start := next()
	if start.Event.Start == nil {
		t.Fatalf("first message %+v, want start", start)
	}
	pid := start.Event.Start.Pid
	again := openStream(t, srv, c, "Connect", map[string]any{"process": map[string]any{"tag": "mine"}})
	if m := again(); m.Event.Start == nil || m.Event.Start.Pid != pid {
		t.Fatalf("connect by tag: %+v", m)
	}
	_, body := call(t, "POST", srv.URL+"/process.Process/List", "", map[string]any{}, hdr...)
	if !strings.Contains(string(body), `"tag":"mine"`) || !strings.Contains(string(body), `"cmd":"cat"`) {
		t.Errorf("list: %s", body)
	}
	for _, chunk := range []string{"aGVs", "bG8="} { // "hel", "lo" in base64
		if status, body := call(t, "POST", srv.URL+"/process.Process/SendInput", "", map[string]any{
			"process": map[string]any{"pid": pid}, "input": map[string]any{"stdin": chunk}}, hdr...); status != http.StatusOK {
			t.Fatalf("send input: %d %s", status, body)
		}
	}
	call(t, "POST", srv.URL+"/process.Process/CloseStdin", "", map[string]any{"process": map[string]any{"pid": pid}}, hdr...)
	for _, read := range []func() *processEventMsg{next, again} {
		var out []byte
		var end *endEvent
		for m := read(); m != nil; m = read() {
			if m.Event.Data != nil {
				out = append(out, m.Event.Data.Stdout...)
			}
			if m.Event.End != nil {
				end = m.Event.End
			}
		}
		if string(out) != "hello" || end == nil || end.ExitCode != 0 {
			t.Errorf("a stream saw %q and end %+v, want hello and exit 0", out, end)
		}
	}
	if status, body := call(t, "POST", srv.URL+"/process.Process/SendSignal", "", map[string]any{
		"process": map[string]any{"pid": pid}, "signal": "SIGNAL_SIGKILL"}, hdr...); status != http.StatusNotFound {
		t.Errorf("kill of an ended process: %d %s, want 404 (the SDK's kill() then returns false)", status, body)
	}
	if status, _ := call(t, "POST", srv.URL+"/process.Process/SendInput", "", map[string]any{
		"process": map[string]any{"pid": 999}, "input": map[string]any{"stdin": "eA=="}}, hdr...); status != http.StatusNotFound {
		t.Errorf("input to an unknown pid: %d", status)
	}
}

// fakeTerminal echoes what is typed, prints "size R C" on a resize, exits 3 at a Ctrl-D and
// 137 when its exec is cancelled (a kill).
func fakeTerminal(ctx context.Context, req api.ExecRequest, input <-chan api.TTYInput, out io.Writer) api.ExitStatus {
	for {
		select {
		case in, ok := <-input:
			if !ok || in.EOF {
				return api.ExitStatus{Code: 99} // the gateway never closes a terminal's input
			}
			if bytes.Contains(in.Stdin, []byte{ctrlD}) {
				return api.ExitStatus{Code: 3}
			}
			if in.Resize != nil {
				fmt.Fprintf(out, "size %d %d\n", in.Resize.Rows, in.Resize.Cols)
			}
			out.Write(in.Stdin)
		case <-ctx.Done():
			return api.ExitStatus{Code: 137, Signal: "SIGKILL"}
		}
	}
}

// readUntil reads a stream's messages until one's pty data ends with want, or its end.
func readUntil(t *testing.T, next func() *processEventMsg, want string) (string, *endEvent) {
	t.Helper()
	var out []byte
	for m := next(); m != nil; m = next() {
		if m.Event.Data != nil {
			if len(m.Event.Data.Stdout) > 0 || len(m.Event.Data.Stderr) > 0 {
				t.Errorf("terminal output in stdout/stderr: %+v", m.Event.Data)
			}
			out = append(out, m.Event.Data.Pty...)
			if want != "" && strings.HasSuffix(string(out), want) {
				return string(out), nil
			}
		}
		if m.Event.End != nil {
			return string(out), m.Event.End
		}
	}
	return string(out), nil
}

// TestPtyInputResizeEOF drives a terminal process as the SDK's pty.create, sendInput,
// resize and CloseStdin do.
func TestPtyInputResizeEOF(t *testing.T) {
	f := newFake(t)
	f.tty = fakeTerminal
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	next := openStream(t, srv, c, "Start", map[string]any{
		"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-i", "-l"}, "envs": map[string]string{"TERM": "xterm-256color"}},
		"pty":     map[string]any{"size": map[string]any{"cols": 100, "rows": 30}}})
	start := next()
	if start.Event.Start == nil || start.Event.Start.Pid != 201 {
		t.Fatalf("first message %+v, want start with the pid in the sandbox (201)", start)
	}
	pid := start.Event.Start.Pid
	// The image has no bash: an interactive /bin/sh, not a login shell.
	if calls := f.calls(); calls[len(calls)-1] != "exec-tty 30x100 /bin/sh -i" {
		t.Errorf("exec call: %v", calls)
	}
	sel := map[string]any{"pid": pid}
	rpc := func(method string, body map[string]any) (int, string) {
		t.Helper()
		status, out := call(t, "POST", srv.URL+"/process.Process/"+method, "", body, hdr...)
		return status, string(out)
	}
	if status, body := rpc("SendInput", map[string]any{"process": sel, "input": map[string]any{"pty": "ZWNobyBoaQo="}}); status != http.StatusOK {
		t.Fatalf("send pty input: %d %s", status, body)
	}
	if out, _ := readUntil(t, next, "echo hi\n"); out != "echo hi\n" {
		t.Errorf("typed %q", out)
	}
	if status, body := rpc("Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 132, "rows": 50}}}); status != http.StatusOK {
		t.Fatalf("resize: %d %s", status, body)
	}
	if out, _ := readUntil(t, next, "size 50 132\n"); out != "size 50 132\n" {
		t.Errorf("after the resize %q", out)
	}
	if status, _ := rpc("Update", map[string]any{"process": sel, "pty": map[string]any{}}); status != http.StatusBadRequest {
		t.Errorf("resize without a size: %d", status)
	}
	if status, body := rpc("CloseStdin", map[string]any{"process": sel}); status != http.StatusOK {
		t.Fatalf("close stdin: %d %s", status, body)
	}
	if _, end := readUntil(t, next, ""); end == nil || end.ExitCode != 3 {
		t.Errorf("end %+v, want exit code 3 (the fake terminal's Ctrl-D)", end)
	}
	if status, _ := rpc("SendInput", map[string]any{"process": sel, "input": map[string]any{"pty": "eA=="}}); status != http.StatusNotFound {
		t.Errorf("input to an ended terminal: %d, want 404", status)
	}
}

// TestPtyNotStartedAndNoTerminal: a terminal command that could not be started gets a
// handle above any pid and its exit code; a command on pipes takes no terminal calls.
func TestPtyNotStartedAndNoTerminal(t *testing.T) {
	f := newFake(t) // no f.tty: the fake's terminal commands fail to start
	f.exec = func(req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) api.ExitStatus {
		io.Copy(io.Discard, stdin)
		return api.ExitStatus{}
	}
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	next := openStream(t, srv, c, "Start", map[string]any{"process": map[string]any{"cmd": "nope"}, "pty": map[string]any{}})
	if m := next(); m.Event.Start == nil || m.Event.Start.Pid != syntheticPid+1 {
		t.Fatalf("first message %+v, want start with a synthetic handle", m)
	}
	if _, end := readUntil(t, next, ""); end == nil || end.ExitCode != 127 {
		t.Errorf("end %+v, want 127", end)
	}
	if calls := f.calls(); calls[len(calls)-1] != "exec-tty 0x0 nope" {
		t.Errorf("exec call: %v (a Start without a size takes the init's default)", calls)
	}
	pipes := openStream(t, srv, c, "Start", map[string]any{"process": map[string]any{"cmd": "cat"}, "stdin": true})
	pid := pipes().Event.Start.Pid
	sel := map[string]any{"pid": pid}
	for method, body := range map[string]map[string]any{
		"Update":    {"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 1, "rows": 1}}},
		"SendInput": {"process": sel, "input": map[string]any{"pty": "eA=="}},
	} {
		if status, out := call(t, "POST", srv.URL+"/process.Process/"+method, "", body, hdr...); status != http.StatusBadRequest || !strings.Contains(string(out), "failed_precondition") {
			t.Errorf("%s on a process without a terminal: %d %s", method, status, out)
		}
	}
	call(t, "POST", srv.URL+"/process.Process/CloseStdin", "", map[string]any{"process": sel}, hdr...)
	if _, end := readUntil(t, pipes, ""); end == nil || end.ExitCode != 0 {
		t.Errorf("cat's end %+v", end)
	}
}

// TestSignals: SIGTERM is sent (once, by tag) and the command decides how it ends; SIGKILL
// kills it.
func TestSignals(t *testing.T) {
	f := newFake(t)
	term := make(chan string, 1)
	f.signal = func(tag, sig string) { term <- sig }
	f.tty = func(ctx context.Context, req api.ExecRequest, input <-chan api.TTYInput, out io.Writer) api.ExitStatus {
		select {
		case sig := <-term: // like trap 'echo got TERM; exit 7' TERM
			fmt.Fprintf(out, "got %s\n", sig)
			return api.ExitStatus{Code: 7}
		case <-ctx.Done():
			return api.ExitStatus{Code: 137, Signal: "SIGKILL"}
		}
	}
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	for _, tc := range []struct {
		signal any
		out    string
		code   int32
		call   string
	}{
		{"SIGNAL_SIGTERM", "got SIGTERM\n", 7, "signal SIGTERM e2b-1"},
		{15, "got SIGTERM\n", 7, "signal SIGTERM e2b-2"},
		{"SIGNAL_SIGKILL", "", 137, "kill e2b-3"},
	} {
		next := openStream(t, srv, c, "Start", map[string]any{"process": map[string]any{"cmd": "sh"}, "pty": map[string]any{}})
		pid := next().Event.Start.Pid
		if status, body := call(t, "POST", srv.URL+"/process.Process/SendSignal", "", map[string]any{
			"process": map[string]any{"pid": pid}, "signal": tc.signal}, hdr...); status != http.StatusOK {
			t.Fatalf("signal %v: %d %s", tc.signal, status, body)
		}
		out, end := readUntil(t, next, "")
		if out != tc.out || end == nil || end.ExitCode != tc.code {
			t.Errorf("signal %v: output %q end %+v, want %q and exit code %d", tc.signal, out, end, tc.out, tc.code)
		}
		if calls := f.calls(); calls[len(calls)-1] != tc.call {
			t.Errorf("signal %v: backend calls %v, want %q last", tc.signal, calls, tc.call)
		}
	}
	if status, _ := call(t, "POST", srv.URL+"/process.Process/SendSignal", "", map[string]any{
		"process": map[string]any{"pid": 201}, "signal": "SIGNAL_SIGHUP"}, hdr...); status != http.StatusNotFound {
		t.Errorf("a signal to an ended process: %d", status)
	}
}

func TestShArgv(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"-l", "-c", "echo -l"}, []string{"/bin/sh", "-c", "echo -l"}},
		{[]string{"-i", "-l"}, []string{"/bin/sh", "-i"}},
		{[]string{"--login", "-i"}, []string{"/bin/sh", "-i"}},
		{[]string{"script.sh", "-l"}, []string{"/bin/sh", "script.sh", "-l"}},
		{nil, []string{"/bin/sh"}},
	} {
		if got := shArgv(tc.in); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("shArgv(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
