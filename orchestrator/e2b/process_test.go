package e2b

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
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
