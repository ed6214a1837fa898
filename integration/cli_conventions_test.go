package integration

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestCLIConventions runs the CLI the way docker and kubectl users do (issue 19), against a
// real daemon: one case per convention, each checking the exit code and what was printed.
func TestCLIConventions(t *testing.T) {
	d := startDaemon(t)
	d.createPool("conv", busyboxImage, 2, "--label", "team=a")
	a := d.lease("conv", "--label", "who=alice")
	b := d.lease("conv", "--label", "who=bob")
	missing := filepath.Join(shortTempDir(t), "nothing.sock")
	// Symlinks inside the sandbox: one within, one climbing out (it must stay in the root).
	d.cli("exec", a.ID, "sh", "-c", "mkdir -p /data/real && echo inside > /data/real/f && ln -s /data/real /data/link && "+
		"ln -s ../../../../../../etc /data/up && echo sandbox-passwd > /etc/passwd.mark")
	local := shortTempDir(t)
	for _, f := range []string{"one", "two"} {
		if err := os.WriteFile(filepath.Join(local, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A service on the host, on the sandbox network's gateway: host.deltabox.internal.
	gw := d.net.subnet.Addr().Next().String()
	hl, err := net.Listen("tcp", gw+":0")
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the host") })}
	go hostSrv.Serve(hl)
	t.Cleanup(func() { hostSrv.Close() })
	hostURL := fmt.Sprintf("http://host.deltabox.internal:%d/", hl.Addr().(*net.TCPAddr).Port)
	allowed := strings.TrimSpace(d.cli("lease", "--pool", "conv", "--allow", fmt.Sprintf("host.deltabox.internal:%d,GET", hl.Addr().(*net.TCPAddr).Port)))
	badPolicy := filepath.Join(local, "bad.yaml")
	os.WriteFile(badPolicy, []byte("version: 1\nrules:\n  - host: x\n    colour: red\n    action: pass\n"), 0o644)
	readLocal := func(name string) string {
		data, _ := os.ReadFile(filepath.Join(local, name))
		return string(data)
	}

	type tc struct {
		name   string
		args   []string
		code   int
		stdout []string // substrings of stdout
		stderr []string // substrings of stderr
		check  func(t *testing.T, stdout, stderr string)
	}
	cases := []tc{
		// 1. exec like docker.
		{name: "exec without --", args: []string{"exec", a.ID, "sh", "-c", "echo hi; echo -n x >&2"}, stdout: []string{"hi\n"}, stderr: []string{"x"}},
		{name: "exec flags before the ID, command flags kept", args: []string{"exec", "-e", "V=1", a.ID, "sh", "-c", "echo $V $0", "-o"}, stdout: []string{"1 -o"}},
		{name: "exec old form with --", args: []string{"exec", a.ID, "--timeout", "5", "--", "echo", "ok"}, stdout: []string{"ok"}},
		{name: "exec exit code", args: []string{"exec", a.ID, "sh", "-c", "exit 7"}, code: 7},
		{name: "exec --timeout plain seconds", args: []string{"exec", "--timeout", "0.3", a.ID, "sleep", "5"}, code: 137, stderr: []string{"timed out after 300ms"}},
		{name: "exec bad --timeout", args: []string{"exec", "--timeout", "soon", a.ID, "true"}, code: 2, stderr: []string{`--timeout "soon": want seconds`}},
		{name: "exec output cap says it cut", args: []string{"exec", "--output-cap", "4", a.ID, "echo", "0123456789"}, stdout: []string{"0123"}, stderr: []string{"stdout cut at 4 bytes (--output-cap)"}},
		{name: "exec -t gives a terminal", args: []string{"exec", "-t", a.ID, "sh", "-c", "tty; exit 4"}, code: 4, stdout: []string{"/dev/pts/"}},
		{name: "exec -it needs a terminal on stdin", args: []string{"exec", "-it", a.ID, "sh"}, code: 2, stderr: []string{"standard input is not a terminal", "-i without -t"}},
		{name: "exec -d prints a proc ID", args: []string{"exec", "-d", a.ID, "sh", "-c", "echo start; sleep 0.5; echo end >&2; exit 3"}, stdout: []string{"p1\n"}},
		{name: "logs -f follows to the end", args: []string{"logs", "-f", a.ID, "p1"}, stdout: []string{"start\n"}, stderr: []string{"end\n"}},
		{name: "ps lists detached execs", args: []string{"ps", a.ID}, stdout: []string{"p1", "exited 3", "sh -c"}},
		{name: "logs of the latest proc", args: []string{"logs", a.ID}, stdout: []string{"start\n"}},
		{name: "logs of an unknown proc", args: []string{"logs", a.ID, "p9"}, code: 1, stderr: []string{"not_found", "p9"}},
		// 3. cp like docker.
		{name: "cp through a symlink inside the sandbox", args: []string{"cp", a.ID + ":/data/link/f", filepath.Join(local, "f")}, check: func(t *testing.T, _, _ string) {
			if got := readLocal("f"); got != "inside\n" {
				t.Fatalf("copied %q, want the sandbox's /data/real/f", got)
			}
		}},
		{name: "cp symlink climbing out stays in the root", args: []string{"cp", a.ID + ":/data/up/passwd.mark", filepath.Join(local, "mark")}, check: func(t *testing.T, _, _ string) {
			if got := readLocal("mark"); got != "sandbox-passwd\n" {
				t.Fatalf("copied %q, want the sandbox's /etc/passwd.mark", got)
			}
		}},
		{name: "cp several sources into a symlinked dir", args: []string{"cp", filepath.Join(local, "one"), filepath.Join(local, "two"), a.ID + ":/data/link"}, check: func(t *testing.T, _, _ string) {
			if out := d.cli("exec", a.ID, "cat", "/data/real/one", "/data/real/two"); out != "onetwo" {
				t.Fatalf("the sandbox has %q in /data/real, want onetwo", out)
			}
		}},
		{name: "cp to - streams a tar", args: []string{"cp", a.ID + ":/data/real", "-"}, check: func(t *testing.T, out, _ string) {
			tr := tar.NewReader(strings.NewReader(out))
			var names []string
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				names = append(names, h.Name)
			}
			if !slices.Contains(names, "real/f") {
				t.Fatalf("tar on stdout has %v, want real/f", names)
			}
		}},
		{name: "cp without -p needs the parent", args: []string{"cp", filepath.Join(local, "one"), a.ID + ":/new/deep/one"}, code: 1, stderr: []string{"not_found", "/new"}},
		{name: "cp -p makes the parents", args: []string{"cp", "-p", filepath.Join(local, "one"), a.ID + ":/new/deep/one"}, check: func(t *testing.T, _, _ string) {
			if out := d.cli("exec", a.ID, "sh", "-c", "cat /new/deep/one; stat -c %u:%a /new/deep"); out != "one0:755\n" {
				t.Fatalf("cp -p left %q in the sandbox", out)
			}
		}},
		{name: "cp both local", args: []string{"cp", "a", "b"}, code: 2, stderr: []string{"cannot both be local"}},
		// 6. commit --checkpoint protects the work just done.
		{name: "commit --checkpoint", args: []string{"commit", "--checkpoint", a.ID}, stdout: []string{"committed at checkpoint"}, check: func(t *testing.T, _, _ string) {
			var cks []api.Checkpoint
			d.cliJSON(&cks, "checkpoint", "ls", a.ID)
			last := cks[len(cks)-1]
			if last.Message != "commit --checkpoint" || !last.Committed {
				t.Fatalf("latest checkpoint %+v: want the one commit --checkpoint took, committed", last)
			}
		}},
		// 7. progress: pool create --wait waits for min_ready, with progress lines in JSON.
		{name: "pool create --wait", args: []string{"-o", "json", "pool", "create", "waited", "--image", busyboxImage, "--min-ready", "2", "--wait"}, check: func(t *testing.T, out, _ string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if !strings.Contains(lines[0], `"phase":"ready"`) {
				t.Fatalf("no progress line first: %s", out)
			}
			var p api.PoolInfo
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &p); err != nil || p.Ready < 2 {
				t.Fatalf("pool create --wait answered %v (ready %d), want 2 ready\n%s", err, p.Ready, out)
			}
		}},
		// 8. info shows where sandboxes reach the host and the proxy.
		{name: "info shows the gateway and the proxy", args: []string{"info"}, stdout: []string{"Sandbox network:", "the host (gateway) at " + d.net.subnet.Addr().Next().String(), "Egress proxy:", "http://" + d.net.subnet.Addr().Next().String() + ":"}},
		// 4. egress policies.
		{name: "policy default checks", args: []string{"policy", "default"}, stdout: []string{"version: 1", "default: hold"}},
		{name: "policy check names line and field", args: []string{"policy", "check", badPolicy}, code: 1, stderr: []string{"invalid_argument", `line 4: unknown field "colour"`}, check: func(t *testing.T, _, errOut string) {
			if strings.Contains(errOut, "proxy.") || strings.HasSuffix(strings.TrimSpace(errOut), "invalid argument") {
				t.Fatalf("stderr names Go types or repeats the class: %s", errOut)
			}
		}},
		{name: "host.deltabox.internal with --allow", args: []string{"exec", allowed, "wget", "-qO-", hostURL}, stdout: []string{"from the host"}},
		{name: "host.deltabox.internal needs a rule naming it", args: []string{"exec", a.ID, "wget", "-qO-", hostURL}, code: 1, stderr: []string{"403"}},
		{name: "denied requests are effects", args: []string{"effects", "ls", a.ID, "--status", "denied"}, stdout: []string{"denied", "host.deltabox.internal", "only a rule naming it may allow it"}},
		{name: "release the --allow lease", args: []string{"release", allowed}, stdout: []string{allowed}},
		{name: "--allow with a bad port", args: []string{"lease", "--pool", "conv", "--allow", "x:99999"}, code: 2, stderr: []string{`port "99999" is not 1-65535`}},
		// 2. output like kubectl.
		{name: "-o json after the verb", args: []string{"ls", "-o", "json"}, check: func(t *testing.T, out, _ string) {
			var sbs []api.Sandbox
			if err := json.Unmarshal([]byte(out), &sbs); err != nil || len(sbs) != 2 {
				t.Fatalf("ls -o json: %v\n%s", err, out)
			}
		}},
		{name: "-o yaml", args: []string{"inspect", a.ID, "-o", "yaml"}, check: func(t *testing.T, out, _ string) {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(out), &m); err != nil || m["pool"] != "conv" {
				t.Fatalf("inspect -o yaml: %v\n%s", err, out)
			}
		}},
		{name: "-o wide", args: []string{"ls", "-o", "wide"}, stdout: []string{"IP", "LABELS", "who=alice"}},
		{name: "--format template per item", args: []string{"ls", "--format", "{{.pool}}:{{.labels.who}}"}, stdout: []string{"conv:alice\n", "conv:bob\n"}},
		{name: "ls -q", args: []string{"ls", "-q"}, check: func(t *testing.T, out, _ string) {
			if f := strings.Fields(out); len(f) != 2 || !strings.Contains(out, a.ID) || !strings.Contains(out, b.ID) {
				t.Fatalf("ls -q printed %q", out)
			}
		}},
		{name: "ls --filter label", args: []string{"ls", "-q", "--filter", "label=who=bob"}, check: func(t *testing.T, out, _ string) {
			if strings.TrimSpace(out) != b.ID {
				t.Fatalf("ls -q --filter label=who=bob printed %q, want %s", out, b.ID)
			}
		}},
		{name: "ls --filter pool,state", args: []string{"ls", "-q", "--filter", "pool=conv,state=leased"}, check: func(t *testing.T, out, _ string) {
			if len(strings.Fields(out)) != 2 {
				t.Fatalf("ls --filter pool=conv,state=leased printed %q", out)
			}
		}},
		{name: "ls --filter no match is []", args: []string{"-o", "json", "ls", "--filter", "pool=other"}, stdout: []string{"[]"}},
		{name: "JSON error with the API code", args: []string{"inspect", "no-such-sandbox", "-o", "json"}, code: 1, check: func(t *testing.T, _, errOut string) {
			var e struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal([]byte(errOut), &e); err != nil || e.Error.Code != "not_found" || !strings.Contains(e.Error.Message, "no-such-sandbox") {
				t.Fatalf("stderr is not a not_found JSON error: %v\n%s", err, errOut)
			}
		}},
		{name: "text error names the code once", args: []string{"pool", "create", "conv", "--image", busyboxImage}, code: 1, check: func(t *testing.T, _, errOut string) {
			if !strings.HasPrefix(errOut, "deltabox: conflict: ") || strings.Contains(errOut, "already exists: already exists") {
				t.Fatalf("stderr %q: want `deltabox: conflict: ...` without the class repeated", errOut)
			}
		}},
		{name: "unknown pool", args: []string{"lease", "--pool", "nope"}, code: 1, stderr: []string{"not_found", "nope"}},
		{name: "unreachable socket", args: []string{"--address", missing, "ls"}, code: 1, stderr: []string{"unavailable", missing, "deltabox daemon"}},
		{name: "mistyped verb suggests", args: []string{"relaese", a.ID}, code: 2, stderr: []string{`did you mean "release"`}},
		{name: "--version", args: []string{"--version"}, stdout: []string{"deltabox version"}},
		{name: "help of a subcommand", args: []string{"help", "pool", "create"}, stdout: []string{"deltabox pool create", "--min-ready"}},
		{name: "group lists its subcommands", args: []string{"pool"}, code: 2, stderr: []string{"create", "scale", "needs a subcommand"}},
		{name: "daemon --help shows FILE", args: []string{"daemon", "--help"}, stdout: []string{"--config FILE"}},
		{name: "bash completion", args: []string{"completion", "bash"}, stdout: []string{"complete -o default -F _deltabox_complete deltabox"}},
		{name: "zsh completion", args: []string{"completion", "zsh"}, stdout: []string{"compdef _deltabox deltabox"}},
		{name: "fish completion", args: []string{"completion", "fish"}, stdout: []string{"complete -c deltabox"}},
		{name: "completion of verbs", args: []string{"pool", "--generate-bash-completion"}, stdout: []string{"create\n", "scale\n"}},
		{name: "completion of sandbox IDs", args: []string{"exec", "--generate-bash-completion"}, stdout: []string{a.ID, b.ID}},
		// Several IDs; the last case releases both sandboxes.
		{name: "several IDs, one missing", args: []string{"release", a.ID, "no-such-sandbox", b.ID}, code: 1, stdout: []string{a.ID + "\n", b.ID + "\n"}, stderr: []string{"no-such-sandbox", "not_found"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := d.cliRaw(c.args...)
			if code != c.code {
				t.Fatalf("deltabox %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(c.args, " "), code, c.code, out, errOut)
			}
			for _, s := range c.stdout {
				mustContain(t, "stdout of deltabox "+strings.Join(c.args, " "), out, s)
			}
			for _, s := range c.stderr {
				mustContain(t, "stderr of deltabox "+strings.Join(c.args, " "), errOut, s)
			}
			if c.check != nil {
				c.check(t, out, errOut)
			}
		})
	}
	if out := d.cli("ls", "-q"); strings.TrimSpace(out) != "" {
		t.Fatalf("release a b c left sandboxes leased: %q", out)
	}
	_ = os.Remove(missing)
}
