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

func TestReorderArgs(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	cases := map[string]string{
		"deltabox pool create py --image x --min-ready 2":     "deltabox pool create --image x --min-ready 2 py",
		"deltabox -o json pool create py --image=x":           "deltabox -o json pool create --image=x py",
		"deltabox exec sb-1 --timeout 2s -- sh -c --x":        "deltabox exec --timeout 2s sb-1 -- sh -c --x",
		"deltabox exec -i sb-1 -- cat":                        "deltabox exec -i sb-1 -- cat",
		"deltabox --address /s exec sb-1 -e A=1 -- env --e x": "deltabox --address /s exec -e A=1 sb-1 -- env --e x",
		"deltabox rollback sb-1 --force --to 3":               "deltabox rollback --force --to 3 sb-1",
	}
	for in, want := range cases {
		if got := strings.Join(reorderArgs(app, strings.Fields(in)), " "); got != want {
			t.Errorf("reorder %q:\n got  %q\n want %q", in, got, want)
		}
	}
}
