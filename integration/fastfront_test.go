package integration

import (
	"bytes"
	"context"
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
	run := func(bin string, args []string) (string, string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, args...)
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
	}{
		{"lease", at("lease", "--pool", "fast"), true, 0, true},
		{"lease, flags after", []string{"lease", "--pool=fast", "-a", d.address, "-o", "wide"}, true, 0, true},
		{"lease, unknown pool", at("lease", "--pool", "nope"), true, 1, false},
		{"lease, unreachable socket", []string{"-a", missing, "lease", "--pool", "fast"}, true, 1, false},
		{"exec true", at("exec", sb, "true"), true, 0, false},
		{"exec, exit code and stderr", at("exec", sb, "--", "sh", "-c", "echo out; echo err >&2; exit 3"), true, 3, false},
		{"exec, killed by a signal", at("exec", sb, "sh", "-c", "kill -9 $$"), true, 137, false},
		{"exec, stdin piped but not passed", at("exec", sb, "sh", "-c", "cat; echo done"), true, 0, false},
		{"exec, bytes that need escaping", at("exec", sb, "printf", `<&>"\\%s\n\t\x01é`, "\u2028ü\xff"), true, 0, false},
		{"exec, large output", at("exec", sb, "sh", "-c", "seq 1 30000; seq 1 3000 >&2"), true, 0, false},
		{"exec, output cap notice", at("exec", "--output-cap", "4", sb, "sh", "-c", "echo 0123456789; echo abcdefgh >&2"), true, 0, false},
		{"exec, command not found", at("exec", sb, "no-such-command"), true, 127, false},
		{"exec, unknown sandbox", at("exec", "sb-nope", "true"), true, 1, false},
		{"exec, unreachable socket", []string{"--address", "unix://" + missing, "exec", sb, "true"}, true, 1, false},
		{"version", []string{"--version"}, true, 0, false},
		// Handed over to deltabox-cli.
		{"exec -i, stdin passed", at("exec", "-i", sb, "sh", "-c", "cat; exit 5"), false, 5, false},
		{"-o json exec error", at("-o", "json", "exec", "sb-nope", "true"), false, 1, false},
		{"-o json lease error", at("lease", "--pool", "nope", "-o", "json"), false, 1, false},
		{"-o json unreachable", []string{"-a", missing, "-o", "json", "exec", sb, "true"}, false, 1, false},
		{"exec usage error", at("exec", sb), false, 2, false},
		{"lease usage error", at("lease"), false, 2, false},
		{"exec --timeout", at("exec", "--timeout", "0.3", sb, "sleep", "5"), false, 137, false},
		{"ls", at("ls"), false, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			front := d.env.bin
			if c.fast {
				front = alone
			}
			out, errOut, code := run(front, c.args)
			wantOut, wantErr, wantCode := run(cliBin, c.args)
			if wantCode != c.code {
				t.Errorf("deltabox-cli exited %d, want %d (stderr %q)", wantCode, c.code, wantErr)
			}
			if c.newID && sandboxID.MatchString(out) && sandboxID.MatchString(wantOut) {
				out, wantOut = "ID\n", "ID\n"
			}
			if out != wantOut || errOut != wantErr || code != wantCode {
				t.Errorf("deltabox %q:\nfront: exit %d\nstdout %q\nstderr %q\ncli:   exit %d\nstdout %q\nstderr %q",
					c.args, code, trim(out), errOut, wantCode, trim(wantOut), wantErr)
			}
		})
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
