package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFastMatchesCLI runs the same command lines through bin/deltabox, the fast front
// (cmd/deltabox-fast), and through bin/deltabox-cli, the urfave/cli build, against one real
// daemon, and compares stdout, stderr and the exit code. The lines the front runs itself go
// through a copy of it alone in a directory (no deltabox-cli to hand over to), so that a line
// it wrongly handed over would fail there; the others go through bin/deltabox as installed.
// The "C: " cases take the address from DELTABOX_ADDRESS and check the trace of the front's
// C part (cmd/deltabox-fast/cfront.c: done in C, or handed over to its Go part, or not taken).
func TestFastMatchesCLI(t *testing.T) {
	d := startDaemon(t)
	cliBin := filepath.Join(filepath.Dir(d.env.bin), "deltabox-cli")
	if !fileExists(cliBin) {
		t.Fatalf("%s is missing: make build builds it next to %s", cliBin, d.env.bin)
	}
	alone := filepath.Join(shortTempDir(t), "deltabox")
	copyFile(t, d.env.bin, alone, 0o755)
	d.createPool("fast", busyboxImage, 3)
	sb := d.lease("fast").ID
	missing := filepath.Join(shortTempDir(t), "nothing.sock")
	at := func(args ...string) []string { return append([]string{"--address", d.address}, args...) }
	run := func(bin string, args []string, env ...string) (string, string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdin = strings.NewReader("piped input\n") // read only with -i
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}
	sandboxID := regexp.MustCompile(`^\S+\n$`)
	cases := []struct {
		name string
		args []string
		fast bool // the front runs it itself
		code int  // deltabox-cli's exit code, checked too: the case must test what it says
		// lease prints a new ID each time: both print one line.
		newID bool
		// The daemon's address from DELTABOX_ADDRESS (not --address), and the C front's
		// trace for it (cfront.c: it runs lease and exec lines without flags itself).
		trace string
	}{
		{"lease", at("lease", "--pool", "fast"), true, 0, true, ""},
		{"lease, flags after", []string{"lease", "--pool=fast", "-a", d.address, "-o", "wide"}, true, 0, true, ""},
		{"lease -o json", at("-o", "json", "lease", "--pool", "fast"), true, 0, true, ""},
		{"lease, unknown pool", at("lease", "--pool", "nope"), true, 1, false, ""},
		{"lease, unreachable socket", []string{"-a", missing, "lease", "--pool", "fast"}, true, 1, false, ""},
		{"exec true", at("exec", sb, "true"), true, 0, false, ""},
		{"exec, exit code and stderr", at("exec", sb, "--", "sh", "-c", "echo out; echo err >&2; exit 3"), true, 3, false, ""},
		{"exec, killed by a signal", at("exec", sb, "sh", "-c", "kill -9 $$"), true, 137, false, ""},
		{"exec, stdin piped but not passed", at("exec", sb, "sh", "-c", "cat; echo done"), true, 0, false, ""},
		{"exec, bytes that need escaping", at("exec", sb, "printf", `<&>"\\%s\n\t\x01é`, "\u2028ü\xff"), true, 0, false, ""},
		{"exec, large output", at("exec", sb, "sh", "-c", "seq 1 30000; seq 1 3000 >&2"), true, 0, false, ""},
		{"exec, output cap notice", at("exec", "--output-cap", "4", sb, "sh", "-c", "echo 0123456789; echo abcdefgh >&2"), true, 0, false, ""},
		{"exec, command not found", at("exec", sb, "no-such-command"), true, 127, false, ""},
		{"exec, unknown sandbox", at("exec", "sb-nope", "true"), true, 1, false, ""},
		{"exec, unreachable socket", []string{"--address", "unix://" + missing, "exec", sb, "true"}, true, 1, false, ""},
		{"version", []string{"--version"}, true, 0, false, ""},
		// -o json: exec prints JSON lines, lease its result indented, errors a document on stderr.
		{"-o json exec", at("-o", "json", "exec", sb, "sh", "-c", "printf 'out\\n\\377'; sleep 0.2; echo '<é>' >&2; exit 3"), true, 3, false, ""},
		{"-o json exec, output cap", at("exec", "-o", "json", "--output-cap", "4", sb, "sh", "-c", "echo 0123456789"), true, 0, false, ""},
		{"-o json exec, command not found", at("--output=json", "exec", sb, "no-such-command"), true, 127, false, ""},
		{"-o json exec error", at("-o", "json", "exec", "sb-nope", "true"), true, 1, false, ""},
		{"-o json lease error", at("lease", "--pool", "nope", "-o", "json"), true, 1, false, ""},
		{"-o json unreachable", []string{"-a", missing, "-o", "json", "exec", sb, "true"}, true, 1, false, ""},
		{"checkpoint create, unknown sandbox", at("checkpoint", "create", "sb-nope"), true, 1, false, ""},
		{"checkpoint create, unknown sandbox, -o json", at("checkpoint", "create", "sb-nope", "-m", "x", "-o", "json"), true, 1, false, ""},
		{"rollback, unknown sandbox", at("rollback", "sb-nope", "--to", "@"), true, 1, false, ""},
		{"rollback, unknown sandbox, -o json", at("-o", "json", "rollback", "sb-nope"), true, 1, false, ""},
		{"release, unknown sandbox", at("release", "sb-nope"), true, 1, false, ""},
		{"release, unknown sandbox, -o json", at("release", "sb-nope", "-o", "json"), true, 1, false, ""},
		{"release, unknown sandboxes, -o json", at("release", "sb-nope", "sb-nope2", "-o", "json"), true, 1, false, ""},
		{"release, unreachable socket", []string{"-a", missing, "release", "a", "b"}, true, 1, false, ""},
		// The C front (address from the environment).
		{"C: lease", []string{"lease", "--pool", "fast"}, true, 0, true, "lease: done in C\n"},
		{"C: lease, unknown pool", []string{"lease", "--pool=nope"}, true, 1, false, "lease: handed over (response)\n"},
		{"C: exec true", []string{"exec", sb, "true"}, true, 0, false, "exec: done in C\n"},
		{"C: exec, exit code and stderr", []string{"exec", sb, "sh", "-c", "echo out; echo err >&2; exit 3"}, true, 3, false, "exec: done in C\n"},
		{"C: exec, killed by a signal", []string{"exec", sb, "sh", "-c", "kill -9 $$"}, true, 137, false, "exec: done in C\n"},
		{"C: exec, escaped bytes", []string{"exec", sb, "printf", `<&>"\\%s\n\t\x01`, "\x7f\x1b"}, true, 0, false, "exec: done in C\n"},
		{"C: exec, large output", []string{"exec", sb, "sh", "-c", "seq 1 30000; seq 1 3000 >&2"}, true, 0, false, "exec: done in C\n"},
		{"C: exec, command not found", []string{"exec", sb, "no-such-command"}, true, 127, false, "exec: handed over (events)\n"},
		{"C: exec, unknown sandbox", []string{"exec", "sb-nope", "true"}, true, 1, false, "exec: handed over (response)\n"},
		{"C: exec, UTF-8 (left to Go)", []string{"exec", sb, "echo", "é"}, true, 0, false, ""},
		{"C: checkpoint create, unknown sandbox", []string{"checkpoint", "create", "sb-nope", "--pin"}, true, 1, false, "checkpoint: handed over (response)\n"},
		{"C: rollback, unknown sandbox", []string{"rollback", "sb-nope", "--to", "@"}, true, 1, false, "rollback: handed over (response)\n"},
		{"C: release, unknown sandbox", []string{"release", "sb-nope"}, true, 1, false, "release: handed over (response)\n"},
		{"C: release, several (left to Go)", []string{"release", "sb-nope", "sb-nope2"}, true, 1, false, ""},
		// Handed over to deltabox-cli.
		{"exec -i, stdin passed", at("exec", "-i", sb, "sh", "-c", "cat; exit 5"), false, 5, false, ""},
		{"-o yaml lease error", at("lease", "--pool", "nope", "-o", "yaml"), false, 1, false, ""},
		{"rollback usage error", at("rollback", sb, "ck"), false, 2, false, ""},
		{"checkpoint create usage error", at("checkpoint", "create"), false, 2, false, ""},
		{"C: checkpoint create, -m and --message (left to Go: a usage error)", []string{"checkpoint", "create", sb, "-m", "a", "--message", "b"}, false, 2, false, ""},
		{"release usage error", at("release"), false, 2, false, ""},
		{"exec usage error", at("exec", sb), false, 2, false, ""},
		{"lease usage error", at("lease"), false, 2, false, ""},
		{"exec --timeout", at("exec", "--timeout", "0.3", sb, "sleep", "5"), false, 137, false, ""},
		{"ls -q", at("ls", "-q"), false, 0, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			front := d.env.bin
			if c.fast {
				front = alone
			}
			var env []string
			trace := filepath.Join(shortTempDir(t), "trace")
			if c.trace != "" || strings.HasPrefix(c.name, "C: ") {
				env = []string{"DELTABOX_ADDRESS=" + d.address, "DELTABOX_FRONT_TRACE=" + trace}
			}
			out, errOut, code := run(front, c.args, env...)
			if tr, _ := os.ReadFile(trace); env != nil && string(tr) != c.trace {
				t.Errorf("C front trace %q, want %q", tr, c.trace)
			}
			wantOut, wantErr, wantCode := run(cliBin, c.args, env...)
			if wantCode != c.code {
				t.Errorf("deltabox-cli exited %d, want %d (stderr %q)", wantCode, c.code, wantErr)
			}
			if c.newID && sandboxID.MatchString(out) && sandboxID.MatchString(wantOut) {
				out, wantOut = "ID\n", "ID\n"
			}
			if strings.HasPrefix(out, "{") { // -o json: a pid, durations
				out, wantOut = millis.ReplaceAllString(out, "${1}MS"), millis.ReplaceAllString(wantOut, "${1}MS")
				out, wantOut = pid.ReplaceAllString(out, "${1}${2}PID"), pid.ReplaceAllString(wantOut, "${1}${2}PID")
			}
			if c.newID && strings.HasPrefix(out, "{") {
				out, wantOut = leasedID.ReplaceAllString(out, "${1}ID\""), leasedID.ReplaceAllString(wantOut, "${1}ID\"")
				out, wantOut = created.ReplaceAllString(out, "${1}TIME\""), created.ReplaceAllString(wantOut, "${1}TIME\"")
				cold := strings.NewReplacer(`"cold": true`, `"cold": ?`, `"cold": false`, `"cold": ?`) // a refill may race either lease
				out, wantOut = cold.Replace(out), cold.Replace(wantOut)
			}
			if out != wantOut || errOut != wantErr || code != wantCode {
				t.Errorf("deltabox %q:\nfront: exit %d\nstdout %q\nstderr %q\ncli:   exit %d\nstdout %q\nstderr %q",
					c.args, code, trim(out), errOut, wantCode, trim(wantOut), wantErr)
			}
		})
	}
}

var (
	leasedID = regexp.MustCompile(`("(?:sandbox|id|name|container|ip)": ")[^"]*"`)
	created  = regexp.MustCompile(`("(?:created|leased_at|[a-z_]*_at)": ")[^"]*"`)
	pid      = regexp.MustCompile(`("(?:pid|init_pid|host_id)":)[0-9]+|("(?:pid|init_pid|host_id)": )[0-9]+`)
	millis   = regexp.MustCompile(`("[a-z_]*_ms": ?)[0-9.e+-]+|(frozen|total) [0-9]+\.[0-9]{2} ms`)
)

// TestFastMatchesCLISteps runs the per-step verbs the front runs (checkpoint create,
// rollback, release; text and -o json) through the front and through deltabox-cli, each on
// a sandbox of its own with the same history, and compares stdout, stderr and the exit code
// once the sandbox and checkpoint IDs, times and durations are replaced by placeholders (the
// exact printing of a result's values is TestReencodeMatchesEncodingJSON's).
func TestFastMatchesCLISteps(t *testing.T) {
	d := startDaemon(t)
	cliBin := filepath.Join(filepath.Dir(d.env.bin), "deltabox-cli")
	alone := filepath.Join(shortTempDir(t), "deltabox")
	copyFile(t, d.env.bin, alone, 0o755)
	d.createPool("steps", busyboxImage, 2, "--max", "12")
	bins := []string{alone, cliBin}
	var sbs [2][]string // per binary: its sandboxes
	for i := 0; i < 4; i++ {
		for b := range bins {
			sbs[b] = append(sbs[b], d.lease("steps").ID)
		}
	}
	run := func(bin string, args []string) (string, string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, append([]string{"--address", d.address}, args...)...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}
	restored := regexp.MustCompile(`("files_restored": )[0-9]+|[0-9]+( files restored)`)
	ckID := regexp.MustCompile(`("(?:checkpoint|parent|to|from)": ")[^"@]*"|checkpoint [^ ]+ \(|rolled back to [^:]+:`)
	normal := func(b int, s string) string {
		for i, id := range sbs[b] {
			s = strings.ReplaceAll(s, id, fmt.Sprintf("SB%d", i))
		}
		s = ckID.ReplaceAllStringFunc(s, func(m string) string {
			switch {
			case strings.HasPrefix(m, "checkpoint "):
				return "checkpoint CK ("
			case strings.HasPrefix(m, "rolled back"):
				return "rolled back to CK:"
			}
			return m[:strings.Index(m, ": ")+3] + "CK\""
		})
		s = created.ReplaceAllString(s, "${1}TIME\"")
		// How many files a rollback restores varies from one sandbox to the other (the
		// daemon's, not the client's, doing).
		s = restored.ReplaceAllString(s, "${1}N${2}")
		return millis.ReplaceAllString(s, "${1}${2} MS")
	}
	cases := []struct {
		name string
		args []string // SB0..SB3 stand for the binary's own sandboxes
		code int
	}{
		{"checkpoint create", []string{"checkpoint", "create", "SB0"}, 0},
		{"checkpoint create, flags, -o json", []string{"checkpoint", "create", "SB0", "-m", `step <1> "é"`, "--name", "n1", "-o", "json"}, 0},
		{"exec", []string{"exec", "SB0", "sh", "-c", "echo changed > /tmp/f; rm -f /etc/motd"}, 0},
		{"checkpoint create --async --pin", []string{"checkpoint", "create", "--async", "--pin", "SB0", "--message=two"}, 0},
		{"checkpoint create --processes, -o json", []string{"-o", "json", "checkpoint", "create", "--processes", "SB0"}, 0},
		{"checkpoint create --level l2", []string{"checkpoint", "create", "--level", "l2", "SB0"}, 0},
		{"checkpoint create, bad level", []string{"checkpoint", "create", "--level", "l9", "SB0"}, 1},
		{"checkpoint create, bad level, -o json", []string{"checkpoint", "create", "--level", "l9", "SB0", "-o", "json"}, 1},
		{"rollback", []string{"rollback", "SB0"}, 0},
		{"rollback --to name, -o json", []string{"rollback", "SB0", "--to", "n1", "-o", "json"}, 0},
		{"rollback --to @~1", []string{"rollback", "--to=@~1", "SB0"}, -1},
		{"rollback, unknown checkpoint", []string{"rollback", "SB0", "--to", "nope"}, 1},
		{"rollback, unknown checkpoint, -o json", []string{"-o", "json", "rollback", "SB0", "--to", "nope"}, 1},
		{"checkpoint create before commit", []string{"checkpoint", "create", "SB1", "--name", "early"}, 0},
		{"exec before commit", []string{"exec", "SB1", "touch", "/tmp/x"}, 0},
		{"commit (handed over)", []string{"commit", "--checkpoint", "SB1"}, 0},
		{"rollback behind the commit point", []string{"rollback", "SB1", "--to", "early"}, 1},
		{"rollback behind the commit point, -o json", []string{"rollback", "SB1", "--to", "early", "-o", "json"}, 1},
		{"rollback behind the commit point --force", []string{"rollback", "SB1", "--to", "early", "--force"}, 0},
		{"release", []string{"release", "SB0"}, 0},
		{"release again", []string{"release", "SB0"}, 1},
		{"release -o json", []string{"release", "SB1", "-o", "json"}, 0},
		{"release several, one unknown", []string{"release", "SB2", "sb-nope", "SB0"}, 1},
		{"release several, -o json", []string{"-o", "json", "release", "SB3", "sb-nope"}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got [2][3]string
			var codes [2]int
			for b, bin := range bins {
				args := make([]string, len(c.args))
				for i, a := range c.args {
					args[i] = a
					if len(a) == 3 && strings.HasPrefix(a, "SB") {
						args[i] = sbs[b][a[2]-'0']
					}
				}
				if c.name == "commit (handed over)" {
					bin = cliBin
				}
				out, errOut, code := run(bin, args)
				got[b] = [3]string{normal(b, out), normal(b, errOut), ""}
				codes[b] = code
			}
			if c.code >= 0 && codes[1] != c.code {
				t.Errorf("deltabox-cli exited %d, want %d (stdout %q, stderr %q)", codes[1], c.code, got[1][0], got[1][1])
			}
			if got[0] != got[1] || codes[0] != codes[1] {
				t.Errorf("deltabox %q:\nfront: exit %d\nstdout %q\nstderr %q\ncli:   exit %d\nstdout %q\nstderr %q",
					c.args, codes[0], got[0][0], got[0][1], codes[1], got[1][0], got[1][1])
			}
		})
	}
}

func trim(s string) string {
	if len(s) > 2000 { // a lease document is ~1000 bytes
		return s[:2000] + "..."
	}
	return s
}
