package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func runArgs(args ...string) (string, string, int) {
	var out, errOut bytes.Buffer
	code := run(append([]string{"deltabox"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestExitCodes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	cases := []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"version"}, 0, ""},
		{[]string{"no-such-verb"}, 2, `unknown command "no-such-verb"`},
		{[]string{"info", "--bogus"}, 2, "bogus"},
		{[]string{"-o", "yaml", "version"}, 2, "yaml"},
		{[]string{"version", "extra"}, 2, "takes 0 argument"},
		{[]string{"config"}, 2, "needs a subcommand"},
		{[]string{"--address", sock, "info"}, 1, sock},
	}
	for _, c := range cases {
		_, errOut, code := runArgs(c.args...)
		if code != c.code || !strings.Contains(errOut, c.err) {
			t.Errorf("deltabox %v: got exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errOut, c.code, c.err)
		}
	}
}

func TestVersionJSON(t *testing.T) {
	out, _, code := runArgs("-o", "json", "version")
	var v versionResult
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Version == "" || v.Commit == "" {
		t.Fatalf("bad version output (exit %d): %s", code, out)
	}
}

func TestConfigDefaultIsValid(t *testing.T) {
	out, _, code := runArgs("config", "default")
	if code != 0 || !strings.Contains(out, "version = 1") {
		t.Fatalf("config default: exit %d\n%s", code, out)
	}
}
