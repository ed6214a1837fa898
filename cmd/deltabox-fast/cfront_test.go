package main

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
)

// standIn is a daemon stand-in on a unix socket: it answers every request with the bytes of
// the current answer, written in pieces with a pause between them (so that the client reads
// them one at a time), then closes the connection. It counts the requests it reads.
type standIn struct {
	mu       sync.Mutex
	pieces   []string
	requests []string // each request: its line, headers and body
}

func startStandIn(t *testing.T, sock string) *standIn {
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	s := &standIn{}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go s.serve(conn)
		}
	}()
	return s
}

// reset is an answer: the stand-in reads part of the request and closes the connection, so
// that the client's read fails with ECONNRESET.
const reset = "RESET"

func (s *standIn) serve(conn net.Conn) {
	defer conn.Close()
	s.mu.Lock()
	pieces := s.pieces
	s.mu.Unlock()
	if len(pieces) == 1 && pieces[0] == reset {
		conn.Read(make([]byte, 64))
		s.mu.Lock()
		s.requests = append(s.requests, reset)
		s.mu.Unlock()
		return
	}
	br := bufio.NewReader(conn)
	for { // every request on the connection is counted (the client must send one)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		s.mu.Lock()
		s.requests = append(s.requests, fmt.Sprint(req.Method, " ", req.URL, " ", req.Proto, " ", req.Host, " ", req.Header, " ", req.ContentLength, " ", string(body)))
		pieces := s.pieces
		s.mu.Unlock()
		for i, p := range pieces {
			if i > 0 {
				time.Sleep(2 * time.Millisecond)
			}
			if _, err := conn.Write([]byte(p)); err != nil {
				return
			}
		}
		if c, ok := conn.(*net.UnixConn); ok {
			c.CloseWrite()
		}
	}
}

// answer sets the next answer and forgets the requests seen; it returns them.
func (s *standIn) answer(pieces ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := s.requests
	s.pieces, s.requests = pieces, nil
	return seen
}

// httpHead is a response head as net/http writes the daemon's.
func httpHead(status string, headers ...string) string {
	h := "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nDate: Wed, 02 Dec 2026 16:00:00 GMT\r\n"
	for _, x := range headers {
		h += x + "\r\n"
	}
	return h + "\r\n"
}

func withLength(status, body string) string {
	return httpHead(status, fmt.Sprintf("Content-Length: %d", len(body))) + body
}

// chunked encodes body in chunks of the given sizes (the last one repeats), with the final
// empty chunk.
func chunked(body string, sizes ...int) string {
	var b strings.Builder
	for i := 0; len(body) > 0; i++ {
		n := sizes[min(i, len(sizes)-1)]
		n = min(n, len(body))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", n, body[:n])
		body = body[n:]
	}
	return b.String() + "0\r\n\r\n"
}

// cut splits s at n random places (a fixed seed: the same cuts every run).
func cut(s string, n int) []string {
	r := rand.New(rand.NewSource(int64(len(s))))
	var at []int
	for i := 0; i < n; i++ {
		at = append(at, r.Intn(len(s)))
	}
	var out []string
	last := 0
	for _, a := range append(sortInts(at), len(s)) {
		if a > last {
			out = append(out, s[last:a])
			last = a
		}
	}
	return out
}

func sortInts(a []int) []int {
	for i := range a {
		for j := i + 1; j < len(a); j++ {
			if a[j] < a[i] {
				a[i], a[j] = a[j], a[i]
			}
		}
	}
	return a
}

func out(s string) string {
	return `{"o":"` + base64.StdEncoding.EncodeToString([]byte(s)) + `"}` + "\n"
}
func errOut(s string) string {
	return `{"e":"` + base64.StdEncoding.EncodeToString([]byte(s)) + `"}` + "\n"
}

func execHead() string {
	return "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nDate: Wed, 02 Dec 2026 16:00:00 GMT\r\nTransfer-Encoding: chunked\r\n\r\n"
}

// buildFronts builds the front as make build does (cgo, static: the C front in), the front
// without cgo (Go only), and deltabox-cli next to each.
func buildFronts(t *testing.T) (cFront, goFront, cli string) {
	if testing.Short() {
		testutil.SkipOrFail(t, "builds the front and deltabox-cli (-short)")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.SkipOrFail(t, "no gcc: the C front cannot be built")
	}
	dir := t.TempDir()
	builds := []struct {
		out, cgo string
		args     []string
	}{
		{filepath.Join(dir, "c", "deltabox"), "1", []string{"-ldflags", fastLDFlags, "."}},
		{filepath.Join(dir, "go", "deltabox"), "0", []string{"."}},
		{filepath.Join(dir, "c", cliBinary), "0", []string{"-tags", "cli,urfave_cli_no_docs", "../deltabox"}},
	}
	for _, b := range builds {
		cmd := exec.Command("go", append([]string{"build", "-o", b.out}, b.args...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.out, err, out)
		}
	}
	return builds[0].out, builds[1].out, builds[2].out
}

type result struct {
	stdout, stderr string
	code           int
	faults         int64
	trace          string
}

// runFront runs bin with DELTABOX_ADDRESS=sock.
func runFront(t *testing.T, bin, sock string, args ...string) result {
	trace := filepath.Join(t.TempDir(), "trace")
	var o, e strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Env = append(os.Environ(), "DELTABOX_ADDRESS="+sock, "DELTABOX_FRONT_TRACE="+trace)
	_ = cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("%s %q did not run", bin, args)
	}
	tr, _ := os.ReadFile(trace)
	return result{o.String(), e.String(), cmd.ProcessState.ExitCode(),
		cmd.ProcessState.SysUsage().(*syscall.Rusage).Minflt, string(tr)}
}

// TestCFront runs lease, exec, checkpoint create, rollback and release through the C front against a stand-in daemon's answers,
// plain and odd, and checks that the front prints what the Go front (built without cgo) and
// deltabox-cli print for the same answers, that the stand-in saw one request per call, and
// that the C front took the call (done in C or handed over where the trace says).
func TestCFront(t *testing.T) {
	cBin, goBin, cliBin := buildFronts(t)
	sock := filepath.Join(t.TempDir(), "d.sock")
	s := startStandIn(t, sock)

	events := out("hello\n") + errOut("warn: <&>\n") + out("") + out(strings.Repeat("x", 70000)) + out("end\n")
	bigLine := out(strings.Repeat("y", 1<<20)) // longer than the C front's event buffer
	huge := ""
	for i := 0; i < 60; i++ {
		huge += out(fmt.Sprintf("%d %s\n", i, strings.Repeat("z", 48<<10)))
	}
	apiErr := `{"error":{"code":"not_found","message":"sandbox \"sb\": not found"}}` + "\n"
	ck := `{"checkpoint":"ck-1","sandbox":"sb","level":"fs","files_changed":3,"bytes":1024,"frozen_ms":1.234,"total_ms":5.675,"created_at":"2026-12-02T16:00:00Z"}` + "\n"
	ckProcs := `{"checkpoint":"ck-2", "level":"full","files_changed":0,"bytes":0,"frozen_ms":12.5,"total_ms":30.001,` +
		`"processes":[{"pid":7,"comm":"sh","kept":"restorable"},{"pid":8,"comm":"node","kept":"dropped","reason":"holds a socket"}, {"comm":"z","kept":"x","reason":""}]}`
	rb := `{"to":"ck-1","files_restored":2,"ops_undone":1,"effects_dropped":0,"processes_stopped":3,"processes_restored":3,"frozen_ms":4.5,"total_ms":9.875}`
	rbLost := `{"to":"ck-1","files_restored":0,"ops_undone":0,"effects_dropped":1,"processes_stopped":2,"processes_restored":0,"frozen_ms":0.004,"total_ms":0.996,` +
		`"processes_lost":[{"pid":9,"comm":"sleep","reason":"exited"},{"pid":10,"comm":"a.out","reason":"ptrace: EPERM"}]}`
	cases := []struct {
		name   string
		args   []string
		pieces []string
		trace  string // the C front's trace
		cliToo bool   // deltabox-cli prints the same (else: the Go front only; see the case)
	}{
		{"lease", []string{"lease", "--pool", "p"},
			[]string{withLength("200 OK", `{"sandbox":"sb-1","pool":"p","labels":{"a":"<b>"},"env":["X=1"],"cold":false,"lease_ms":0.25}`+"\n")},
			"lease: done in C\n", true},
		{"lease, head and body apart", []string{"lease", "--pool=p"},
			cut(withLength("200 OK", `{"sandbox" : "sb-2" ,"n":-1.5e+3,"x":null,"y":[true,{}]}`), 6), "lease: done in C\n", true},
		{"lease, 404", []string{"lease", "--pool", "nope"},
			[]string{withLength("404 Not Found", `{"error":{"code":"not_found","message":"pool \"nope\": not found"}}`+"\n")},
			"lease: handed over (response)\n", true},
		{"lease, 500 not JSON", []string{"lease", "--pool", "p"},
			cut(withLength("500 Internal Server Error", "boom\n"), 3), "lease: handed over (response)\n", true},
		{"lease, escaped ID", []string{"lease", "--pool", "p"},
			[]string{withLength("200 OK", `{"sandbox":"sb\u002d3"}`)}, "lease: handed over (response)\n", true},
		{"lease, no ID", []string{"lease", "--pool", "p"},
			[]string{withLength("200 OK", `{"pool":"p"}`)}, "lease: handed over (response)\n", true},
		{"lease, chunked", []string{"lease", "--pool", "p"},
			[]string{httpHead("200 OK", "Transfer-Encoding: chunked") + chunked(`{"sandbox":"sb-4"}`, 5)}, "lease: handed over (response)\n", true},
		// cliToo false: the Go front words these errors (a decode error, a base64 error, a
		// stream cut short) otherwise than deltabox-cli (encoding/json's and net/http's
		// messages), as it did before the C front; the C front hands them to it.
		{"lease, bad JSON", []string{"lease", "--pool", "p"},
			[]string{withLength("200 OK", `{"sandbox":"sb-5",}`)}, "lease: handed over (response)\n", false},
		{"lease, cut short", []string{"lease", "--pool", "p"},
			[]string{httpHead("200 OK", "Content-Length: 100") + `{"sandbox":`}, "lease: handed over (response)\n", false},
		{"exec true", []string{"exec", "sb", "true"},
			[]string{execHead() + chunked(`{"exit":{"code":0,"pid":7,"duration_ms":0.5}}`+"\n", 4096)}, "exec: done in C\n", true},
		{"exec, odd chunks, exit 3", []string{"exec", "sb", "sh", "-c", "echo \"a\\b\" <&>\t\x01; exit 3"},
			cut(execHead()+chunked(events+`{"exit":{"code":3,"signal":"","pid":7,"error":"","timed_out":false}}`+"\n", 1, 7, 300, 65536, 3), 40),
			"exec: done in C\n", true},
		{"exec, killed", []string{"exec", "sb", "sleep", "9"},
			[]string{execHead() + chunked(out("x")+`{"exit":{"code":137,"signal":"SIGKILL","pid":7}}`+"\n", 4)}, "exec: done in C\n", true},
		{"exec, unknown event", []string{"exec", "sb", "true"},
			cut(execHead()+chunked(out("before\n")+`{"progress":{"pct":50}}`+"\n"+errOut("after\n")+`{"exit":{"code":2}}`+"\n", 9, 30), 12),
			"exec: handed over (events)\n", true},
		{"exec, error event", []string{"exec", "sb", "true"},
			[]string{execHead() + chunked(out("before\n")+apiErr, 11)}, "exec: handed over (events)\n", true},
		{"exec, timed out", []string{"exec", "sb", "sleep", "9"},
			[]string{execHead() + chunked(out("x\n")+`{"exit":{"code":137,"signal":"SIGKILL","timed_out":true}}`+"\n", 13)}, "exec: handed over (events)\n", true},
		{"exec, output cut", []string{"exec", "sb", "cat", "f"},
			[]string{execHead() + chunked(out("0123")+`{"exit":{"code":0,"stdout_truncated":true}}`+"\n", 100)}, "exec: handed over (events)\n", true},
		{"exec, start error", []string{"exec", "sb", "nope"},
			[]string{execHead() + chunked(`{"exit":{"code":127,"error":"exec: \"nope\": not found"}}`+"\n", 100)}, "exec: handed over (events)\n", true},
		{"exec, huge output", []string{"exec", "sb", "cat", "big"},
			cut(execHead()+chunked(huge+`{"exit":{"code":0}}`+"\n", 32768+7, 1000, 65536), 25), "exec: done in C\n", true},
		{"exec, an event longer than C's buffer", []string{"exec", "sb", "cat", "big"},
			cut(execHead()+chunked(out("a\n")+bigLine+out("b\n")+`{"exit":{"code":4}}`+"\n", 40000), 9), "exec: handed over (events)\n", true},
		{"exec, handed over at a CRLF", []string{"exec", "sb", "true"},
			[]string{execHead() + "7\r\n" + out("")[:7] + "\r\n", "2\r\n" + out("")[7:] + "\r\n" + "8\r\n{\"x\":1}\n\r", "\n14\r\n" + `{"exit":{"code":5}}` + "\n\r\n0\r\n\r\n"},
			"exec: handed over (events)\n", true},
		{"exec, 404", []string{"exec", "nope", "true"},
			[]string{withLength("404 Not Found", apiErr)}, "exec: handed over (response)\n", true},
		{"exec, bad base64", []string{"exec", "sb", "true"},
			[]string{execHead() + chunked(out("ok\n")+`{"o":"@@@@"}`+"\n"+`{"exit":{"code":0}}`+"\n", 100)}, "exec: handed over (events)\n", false},
		{"exec, no exit status", []string{"exec", "sb", "true"},
			[]string{execHead() + chunked(out("ok\n")+`{"o":"b2s`, 5)}, "exec: handed over (events)\n", false},
		{"exec, connection cut in a chunk", []string{"exec", "sb", "true"},
			[]string{execHead() + "ff\r\n" + out("ok\n")}, "exec: handed over (events)\n", true},
		// A read error: Go reports the one C's read got (a socket reports it once).
		{"lease, connection reset", []string{"lease", "--pool", "p"}, []string{reset}, "lease: handed over (response)\n", false},
		{"exec, connection reset", []string{"exec", "sb", "true"}, []string{reset}, "exec: handed over (response)\n", false},
		// --address (DELTABOX_ADDRESS points elsewhere: the flag wins) and exec's --.
		{"lease, --address", []string{"--address", sock, "lease", "--pool", "p"},
			[]string{withLength("200 OK", `{"sandbox":"sb-6"}`)}, "lease: done in C\n", true},
		{"exec, -a=, --", []string{"-a=unix://" + sock, "exec", "sb", "--", "-x", ""},
			[]string{execHead() + chunked(out("-x\n")+`{"exit":{"code":0}}`+"\n", 100)}, "exec: done in C\n", true},
		// Lines the C front leaves to Go (a byte above 0x7f, a flag): no trace, the same output.
		{"exec, UTF-8 argument", []string{"exec", "sb", "echo", "é"},
			[]string{execHead() + chunked(out("é\n")+`{"exit":{"code":0}}`+"\n", 100)}, "", true},
		{"exec --output-cap", []string{"exec", "--output-cap", "2", "sb", "true"},
			[]string{execHead() + chunked(`{"exit":{"code":0}}`+"\n", 100)}, "", true},
		// checkpoint create, rollback and release (one ID).
		{"checkpoint", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", ck)}, "checkpoint: done in C\n", true},
		{"checkpoint, flags, processes", []string{"checkpoint", "create", "-m", "a \"<q>\" \\ \t&", "sb", "--name=n1", "--level", "full", "--pin", "--processes", "--async", "--name", "last"},
			cut(withLength("200 OK", ckProcs), 8), "checkpoint: done in C\n", true},
		{"checkpoint, async, flags first", []string{"checkpoint", "create", "--async", "-m=x", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-3","level":"fs","pending":true,"processes":null,"frozen_ms":0,"total_ms":0.001}`)},
			"checkpoint: done in C\n", true},
		{"checkpoint, ms ties and rounding", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-4","level":"fs","files_changed":0,"bytes":0,"frozen_ms":0.125,"total_ms":2.675}`)},
			"checkpoint: done in C\n", true},
		{"checkpoint, ms rounding up", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-5","level":"fs","frozen_ms":1.005,"total_ms":99.995,"bytes":12345678901}`)},
			"checkpoint: done in C\n", true},
		{"checkpoint, exponent", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-6","level":"fs","frozen_ms":1e3,"total_ms":2}`)},
			"checkpoint: handed over (response)\n", true},
		{"checkpoint, escaped string", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck\u002d7","level":"fs"}`)}, "checkpoint: handed over (response)\n", true},
		{"checkpoint, a process's escaped reason", []string{"checkpoint", "create", "sb", "--processes"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-8","level":"fs","processes":[{"pid":1,"comm":"a","kept":"dropped","reason":"\"x\""}]}`)},
			"checkpoint: handed over (response)\n", true},
		{"checkpoint, 404", []string{"checkpoint", "create", "nope"},
			[]string{withLength("404 Not Found", apiErr)}, "checkpoint: handed over (response)\n", true},
		{"checkpoint, 500 not JSON", []string{"checkpoint", "create", "sb"},
			cut(withLength("500 Internal Server Error", "boom\n"), 3), "checkpoint: handed over (response)\n", true},
		// cliToo false: the CLI's typed decoding refuses (or reads otherwise) what json.go reads.
		{"checkpoint, processes not a list", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-9","level":"fs","processes":{}}`)}, "checkpoint: handed over (response)\n", false},
		{"checkpoint, a number as a string", []string{"checkpoint", "create", "sb"},
			[]string{withLength("200 OK", `{"checkpoint":"ck-9","level":"fs","bytes":"1"}`)}, "checkpoint: handed over (response)\n", false},
		{"checkpoint, cut short", []string{"checkpoint", "create", "sb"},
			[]string{httpHead("200 OK", "Content-Length: 100") + `{"checkpoint":`}, "checkpoint: handed over (response)\n", false},
		{"checkpoint, chunked", []string{"checkpoint", "create", "sb"},
			[]string{httpHead("200 OK", "Transfer-Encoding: chunked") + chunked(ck, 7)}, "checkpoint: handed over (response)\n", true},
		{"checkpoint, connection reset", []string{"checkpoint", "create", "sb"}, []string{reset}, "checkpoint: handed over (response)\n", false},
		{"rollback", []string{"rollback", "sb"},
			[]string{withLength("200 OK", rb)}, "rollback: done in C\n", true},
		{"rollback --to, --force, --replay, processes lost", []string{"rollback", "--replay", "sb", "--to", "ck-1", "--force"},
			cut(withLength("200 OK", rbLost), 5), "rollback: done in C\n", true},
		{"rollback, 409 behind a commit point", []string{"rollback", "sb", "--to=ck-1"},
			[]string{withLength("409 Conflict", `{"error":{"code":"conflict","message":"checkpoint \"ck-1\" is behind commit point \"cp-2\"; use --force"}}`+"\n")},
			"rollback: handed over (response)\n", true},
		{"rollback, 500", []string{"rollback", "sb"},
			[]string{withLength("500 Internal Server Error", `{"error":{"code":"internal","message":"disk on fire"}}`)}, "rollback: handed over (response)\n", true},
		{"rollback, bad JSON", []string{"rollback", "sb"},
			[]string{withLength("200 OK", `{"to":"ck-1",]`)}, "rollback: handed over (response)\n", false},
		{"rollback, a lost process not an object", []string{"rollback", "sb"},
			[]string{withLength("200 OK", `{"to":"ck-1","processes_lost":[1]}`)}, "rollback: handed over (response)\n", false},
		{"release", []string{"release", "sb"},
			[]string{withLength("200 OK", `{"released":"sb"}`+"\n")}, "release: done in C\n", true},
		{"release, empty body", []string{"release", "sb"},
			cut(withLength("200 OK", ""), 2), "release: done in C\n", true},
		{"release, 404", []string{"release", "nope"},
			[]string{withLength("404 Not Found", apiErr)}, "release: handed over (response)\n", true},
		{"release, chunked", []string{"release", "sb"},
			[]string{httpHead("200 OK", "Transfer-Encoding: chunked") + chunked(`{}`, 1)}, "release: handed over (response)\n", true},
		{"release, --address", []string{"--address", sock, "release", "sb"},
			[]string{withLength("200 OK", `{}`)}, "release: done in C\n", true},
		// Lines the C front leaves to Go (several IDs, -o, a byte above 0x7f, another spelling).
		{"release, two IDs", []string{"release", "sb", "sb2"}, []string{withLength("200 OK", `{}`)}, "", true},
		{"checkpoint -o json", []string{"checkpoint", "create", "sb", "-o", "json"}, []string{withLength("200 OK", ck)}, "", false}, // the CLI adds its struct's zero fields
		{"checkpoint, UTF-8 message", []string{"checkpoint", "create", "sb", "-m", "é"}, []string{withLength("200 OK", ck)}, "", true},
		{"rollback -force", []string{"rollback", "sb", "-force"}, []string{withLength("200 OK", rb)}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.answer(c.pieces...)
			env := sock
			if strings.HasPrefix(c.args[0], "-") {
				env = "/nonexistent/deltabox.sock" // the --address flag wins
			}
			got := runFront(t, cBin, env, c.args...)
			req := s.answer(c.pieces...)
			calls := 1 // a request per ID for release
			if c.args[0] == "release" {
				calls = len(c.args) - 1
			}
			if len(req) != calls {
				t.Errorf("the C front sent %d requests: %q", len(req), req)
			}
			if got.trace != c.trace {
				t.Errorf("trace %q, want %q", got.trace, c.trace)
			}
			if strings.HasSuffix(c.trace, ": done in C\n") {
				if got.faults > 120 { // the Go front makes ~200 (main.go); the C front ~40
					t.Errorf("%d page faults: the call did not run in C alone", got.faults)
				}
			}
			want := runFront(t, goBin, env, c.args...)
			if goReq := s.answer(c.pieces...); len(goReq) != calls || len(req) == calls && strings.Join(req, "\n") != strings.Join(goReq, "\n") {
				t.Errorf("requests: C front %q, Go front %q; want the same one", req, goReq)
			}
			compare := func(name string, want result) {
				if got.stdout != want.stdout || got.stderr != want.stderr || got.code != want.code {
					t.Errorf("deltabox %q:\nC front: exit %d\nstdout %q\nstderr %q\n%s: exit %d\nstdout %q\nstderr %q", c.args,
						got.code, trim(got.stdout), got.stderr, name, want.code, trim(want.stdout), want.stderr)
				}
			}
			compare("Go front", want)
			if c.pieces[0] == reset && !strings.Contains(got.stderr, "connection reset by peer") {
				t.Errorf("stderr %q: want the read's error (connection reset by peer)", got.stderr)
			}
			if c.cliToo {
				cli := runFront(t, cliBin, env, c.args...)
				if req := s.answer(c.pieces...); len(req) != calls {
					t.Errorf("deltabox-cli sent %d requests", len(req))
				}
				compare("deltabox-cli", cli)
			}
		})
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:150] + fmt.Sprintf("...(%d bytes)...", len(s)) + s[len(s)-150:]
	}
	return s
}
