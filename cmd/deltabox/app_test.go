package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/config"
	"github.com/deltabox/deltabox/pool/network"
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
		{[]string{"-o", "xml", "version"}, 2, "want text, wide, json or yaml"},
		{[]string{"lesae"}, 2, `did you mean "lease"`},
		{[]string{"pool", "crate"}, 2, `did you mean "create"`},
		{[]string{"pool"}, 2, "create a pool of warm sandboxes"},
		{[]string{"exec", "--timeout", "abc", "x", "true"}, 2, `--timeout "abc": want seconds`},
		{[]string{"ls", "--filter", "colour=red"}, 2, `unknown key "colour"`},
		{[]string{"completion", "tcsh"}, 2, "want bash, zsh or fish"},
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

// TestConfigDefaultIsValid parses what `config default` prints and checks the values the
// docs promise (docs/operations.md, the daemon's flag help).
func TestConfigDefaultIsValid(t *testing.T) {
	out, _, code := runArgs("config", "default")
	if code != 0 {
		t.Fatalf("config default: exit %d\n%s", code, out)
	}
	c, err := config.Parse([]byte(out), "config default")
	if err != nil {
		t.Fatalf("config default does not parse: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"version", c.Version, config.CurrentVersion},
		{"root", c.Root, "/var/lib/deltabox"},
		{"address", c.Address, "/run/deltabox/deltabox.sock"},
		{"socket_group", c.SocketGroup, ""},
		{"containerd.address", c.Containerd.Address, "/run/containerd/containerd.sock"},
		{"containerd.namespace", c.Containerd.Namespace, "deltabox"},
		{"log.level", c.Log.Level, "info"},
		{"log.format", c.Log.Format, "text"},
		{"criu.path", c.CRIU.Path, "criu"},
		{"object_store.uri", c.ObjectStore.URI, ""},
		{"metrics.address", c.Metrics.Address, ""},
		{"checkpoints.retain", c.Checkpoints.Retain, 64},
		{"checkpoints.l2_every", c.Checkpoints.L2Every, 16},
		{"checkpoints.track_changes", c.Checkpoints.TrackChanges, true},
		{"network.enabled", c.Network.Enabled, true},
		{"network.subnet", c.Network.Subnet, "10.213.0.0/16"},
		{"network.proxy_port", c.Network.ProxyPort, uint16(3128)},
		{"egress.body_limit", c.Egress.BodyLimit, int64(10 << 20)},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("config default: %s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	if !reflect.DeepEqual(c, config.Default()) {
		t.Errorf("config default prints\n%+v\nbut the daemon's defaults are\n%+v", c, config.Default())
	}
}

// TestConfigFileNamedDefault: `-c default.toml` is read over the defaults like any file.
func TestConfigFileNamedDefault(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.WriteFile("default.toml", []byte("version = 1\n[log]\nlevel = \"debug\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runArgs("config", "check", "default.toml"); code != 0 {
		t.Fatalf("config check default.toml: exit %d: %s%s", code, out, errOut)
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
		"deltabox exec sb-1 python3 -c print(1)":              "deltabox exec sb-1 python3 -c print(1)",
		"deltabox exec -o json sb-1 ls -o x":                  "deltabox -o json exec sb-1 ls -o x",
		"deltabox exec sb-1 ls -la -- x":                      "deltabox exec sb-1 ls -la -- x",
		"deltabox ls -o json":                                 "deltabox -o json ls",
		"deltabox pool ls --output=yaml":                      "deltabox --output=yaml pool ls",
		"deltabox help pool create":                           "deltabox pool create --help",
		"deltabox daemon --address /s":                        "deltabox daemon --address /s",
	}
	for in, want := range cases {
		args := strings.Fields(in)
		if got := strings.Join(reorderArgs(app, args), " "); got != want {
			t.Errorf("reorder %q:\n got  %q\n want %q", in, got, want)
		}
		if strings.Join(args, " ") != in { // the cli build hands the command line as given over
			t.Errorf("reorder %q changed its input to %q", in, strings.Join(args, " "))
		}
	}
}

// TestConfigDefaultsAgreeWithLibraries: the library defaults a zero option falls back to are
// the config's defaults, so a daemon without a config file and a library user get the same.
func TestConfigDefaultsAgreeWithLibraries(t *testing.T) {
	c := config.Default().Network
	if c.Name != network.DefaultNetworkName || c.Bridge != network.DefaultBridge || c.Subnet != network.DefaultSubnet.String() {
		t.Errorf("config network defaults %q %q %q, network package defaults %q %q %s",
			c.Name, c.Bridge, c.Subnet, network.DefaultNetworkName, network.DefaultBridge, network.DefaultSubnet)
	}
}
