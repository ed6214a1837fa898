package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestDefaultParses(t *testing.T) {
	c := Default()
	if c.Version != CurrentVersion || c.Root != "/var/lib/deltabox" || c.Containerd.Namespace != "deltabox" {
		t.Fatalf("unexpected defaults: %+v", c)
	}
}

func TestUnknownKeyIsNamed(t *testing.T) {
	_, err := Parse([]byte("version = 1\n[containerd]\nadress = \"/x\"\n"), "test.toml")
	if err == nil || !strings.Contains(err.Error(), "containerd.adress") {
		t.Fatalf("want error naming containerd.adress, got %v", err)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("want invalid argument, got %v", err)
	}
}

func TestOverridesKeepDefaults(t *testing.T) {
	c, err := Parse([]byte("version = 1\nroot = \"/tmp/x\"\n"), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Root != "/tmp/x" || c.Containerd.Namespace != "deltabox" {
		t.Fatalf("override lost defaults: %+v", c)
	}
}

func TestVersionRequired(t *testing.T) {
	if _, err := Parse([]byte("root = \"/x\"\n"), "test.toml"); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("want version error, got %v", err)
	}
}

func TestBadLogFormat(t *testing.T) {
	if _, err := Parse([]byte("version = 1\n[log]\nformat = \"xml\"\n"), "t"); err == nil {
		t.Fatal("want error for log.format xml")
	}
}

func TestTrackChanges(t *testing.T) {
	if !Default().Checkpoints.TrackChanges {
		t.Fatal("change tracking is off by default")
	}
	c, err := Parse([]byte("version = 1\n[checkpoints]\ntrack_changes = false\n"), "t.toml")
	if err != nil || c.Checkpoints.TrackChanges || c.Checkpoints.Retain != Default().Checkpoints.Retain {
		t.Fatalf("track_changes = false: %+v, %v", c.Checkpoints, err)
	}
}

// TestFileNamedDefaultKeepsDefaults: a config file called default.toml is a config file like
// any other, laid over the built-in defaults (it used to be decoded onto nothing).
func TestFileNamedDefaultKeepsDefaults(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	text := "version = 1\nroot = \"/srv/db\"\n[log]\nlevel = \"debug\"\n"
	if err := os.WriteFile("default.toml", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"default.toml", "./default.toml", filepath.Join(dir, "default.toml")} {
		c, err := Load(path)
		if err != nil {
			t.Fatalf("load %s: %v", path, err)
		}
		want := Default()
		want.Root, want.Log.Level = "/srv/db", "debug"
		if !reflect.DeepEqual(c, want) {
			t.Errorf("load %s:\n got  %+v\n want %+v", path, c, want)
		}
	}
}

func TestEgressLimitsParseAndValidate(t *testing.T) {
	c, err := Parse([]byte("version = 1\n[egress]\ncommit_attempts = 2\ncommit_timeout = \"5s\"\nmax_connections = 7\nidle_timeout = \"1m\"\n"), "egress.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Egress.CommitAttempts != 2 || c.Egress.CommitTimeout.Duration != 5*time.Second || c.Egress.MaxConnections != 7 ||
		c.Egress.IdleTimeout.Duration != time.Minute || c.Egress.BodyTimeout.Duration != time.Minute {
		t.Fatalf("egress %+v", c.Egress)
	}
	for in, want := range map[string]string{
		"commit_attempts = 0":     "egress.commit_attempts = 0",
		"max_connections = -1":    "egress.max_connections = -1",
		`commit_timeout = "0s"`:   "egress.commit_timeout = 0s",
		`header_timeout = "10ns"`: "egress.header_timeout",
	} {
		_, err := Parse([]byte("version = 1\n[egress]\n"+in+"\n"), "bad.toml")
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", in, err, want)
		}
	}
}

func TestSandboxDefaults(t *testing.T) {
	s := Default().Sandbox
	mem, err1 := s.MemoryBytes()
	disk, err2 := s.DiskBytes()
	if err1 != nil || err2 != nil || mem != 1<<30 || disk != 2<<30 || s.CPUs != 1 || s.Pids != 1024 {
		t.Fatalf("sandbox defaults: %+v (%d, %d, %v, %v)", s, mem, disk, err1, err2)
	}
	c, err := Parse([]byte("version = 1\n[sandbox]\nmemory = \"0\"\ndisk = \"2g\"\n"), "t.toml")
	if err != nil || c.Sandbox.Memory != "0" || c.Sandbox.Pids != 1024 {
		t.Fatalf("override: %+v, %v", c.Sandbox, err)
	}
	for _, bad := range []string{`memory = "lots"`, `disk = "-1g"`, `pids = -1`, `cpus = -0.5`} {
		_, err := Parse([]byte("version = 1\n[sandbox]\n"+bad+"\n"), "t.toml")
		key := "sandbox." + strings.Fields(bad)[0]
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: want an invalid-argument error naming %s, got %v", bad, key, err)
		}
	}
}

func TestE2BListenerRules(t *testing.T) {
	if c, err := Parse([]byte("version = 1\n[e2b]\naddress = \"127.0.0.1:3000\"\napi_keys_file = \"/k\"\n"), "t.toml"); err != nil || c.E2B.DefaultTimeout.Duration != 5*time.Minute {
		t.Errorf("loopback without TLS: %v %+v", err, c.E2B)
	}
	for _, bad := range []string{
		"address = \"0.0.0.0:3000\"\napi_keys_file = \"/k\"",                           // not loopback, no TLS
		"address = \"192.0.2.2:3000\"\napi_keys_file = \"/k\"",                         // idem
		"address = \"127.0.0.1:3000\"",                                                 // no keys
		"address = \"127.0.0.1:3000\"\napi_keys_file = \"/k\"\ntls_cert_file = \"/c\"", // cert without key
		"address = \"127.0.0.1:3000\"\napi_keys_file = \"/k\"\ndefault_timeout = \"2h\"\nmax_timeout = \"1h\"",
	} {
		if _, err := Parse([]byte("version = 1\n[e2b]\n"+bad+"\n"), "t.toml"); err == nil {
			t.Errorf("accepted [e2b] %q", bad)
		}
	}
	if _, err := Parse([]byte("version = 1\n[e2b]\naddress = \"0.0.0.0:3000\"\napi_keys_file = \"/k\"\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\n"), "t.toml"); err != nil {
		t.Errorf("TLS on a public address: %v", err)
	}
}

func TestSnapshotTimeouts(t *testing.T) {
	c, err := Parse([]byte("version = 1\n"), "t.toml")
	if err != nil || c.Snapshots.DumpTimeout.Duration != 2*time.Minute || c.Snapshots.RestoreTimeout.Duration != 2*time.Minute {
		t.Fatalf("defaults: %+v, %v", c.Snapshots, err)
	}
	for key, want := range map[string]string{"dump_timeout": "snapshots.dump_timeout", "restore_timeout": "snapshots.restore_timeout"} {
		_, err := Parse([]byte("version = 1\n[snapshots]\n"+key+" = \"10ms\"\n"), "t.toml")
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s = 10ms: %v, want invalid_argument naming %s", key, err, want)
		}
	}
}

// TestMemoryAreaSizes covers the sizes of the in-memory areas ("": default, "0": none).
func TestMemoryAreaSizes(t *testing.T) {
	for _, area := range []struct {
		section, key string
		get          func(Config) (int64, error)
	}{
		{"checkpoints", "fork_layer_memory", func(c Config) (int64, error) { return c.Checkpoints.ForkLayerMemoryBytes() }},
		{"snapshots", "restore_memory", func(c Config) (int64, error) { return c.Snapshots.RestoreMemoryBytes() }},
	} {
		doc := func(v string) []byte {
			return []byte("version = 1\n[" + area.section + "]\n" + area.key + " = " + v + "\n")
		}
		for v, want := range map[string]int64{`""`: 0, `"0"`: -1, `"2g"`: 2 << 30} {
			c, err := Parse(doc(v), "t.toml")
			if err != nil {
				t.Fatalf("%s = %s: %v", area.key, v, err)
			}
			if got, err := area.get(c); err != nil || got != want {
				t.Errorf("%s = %s: %d %v, want %d", area.key, v, got, err, want)
			}
		}
		_, err := Parse(doc(`"lots"`), "t.toml")
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), area.section+"."+area.key) {
			t.Errorf("%s: a bad size: %v", area.key, err)
		}
	}
}

func TestHugePagesBudget(t *testing.T) {
	if d, err := Default().Checkpoints.HugePagesBudgetDuration(); err != nil || d != 250*time.Millisecond {
		t.Fatalf("default huge_pages_budget: %v, %v", d, err)
	}
	c, err := Parse([]byte("version = 1\n[checkpoints]\nhuge_pages_budget = \"0\"\n"), "t.toml")
	if d, derr := c.Checkpoints.HugePagesBudgetDuration(); err != nil || derr != nil || d != 0 {
		t.Fatalf("huge_pages_budget = \"0\": %v %v %v", d, err, derr)
	}
	for _, bad := range []string{"fast", "-1s", "10"} {
		_, err := Parse([]byte("version = 1\n[checkpoints]\nhuge_pages_budget = \""+bad+"\"\n"), "t.toml")
		if err == nil || !strings.Contains(err.Error(), "checkpoints.huge_pages_budget") || !strings.Contains(err.Error(), "t.toml") {
			t.Fatalf("huge_pages_budget = %q: %v, want an error naming the field and the file", bad, err)
		}
	}
}

func TestTemplateCheckpoints(t *testing.T) {
	if n := Default().Checkpoints.TemplateCheckpoints; n != 10 {
		t.Fatalf("default template_checkpoints = %d, want 10", n)
	}
	c, err := Parse([]byte("version = 1\n[checkpoints]\ntemplate_checkpoints = 0\n"), "t.toml")
	if err != nil || c.Checkpoints.TemplateCheckpoints != 0 {
		t.Fatalf("template_checkpoints = 0 (as retain): %v %+v", err, c.Checkpoints)
	}
	_, err = Parse([]byte("version = 1\n[checkpoints]\ntemplate_checkpoints = -1\n"), "t.toml")
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "checkpoints.template_checkpoints") || !strings.Contains(err.Error(), "t.toml") {
		t.Fatalf("template_checkpoints = -1: %v, want an error naming the field and the file", err)
	}
}

// TestDefaultTextDocumentsEveryKey: every key the daemon reads is in default.toml
// (`deltabox config default`), set to its default and commented.
func TestDefaultTextDocumentsEveryKey(t *testing.T) {
	var missing []string
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if key == "" || key == "-" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(Duration{}) {
				walk(prefix+key+".", ft)
				continue
			}
			if !documented(DefaultText(), strings.TrimSuffix(prefix, "."), key) {
				missing = append(missing, prefix+key)
			}
		}
	}
	walk("", reflect.TypeOf(Config{}))
	if len(missing) > 0 {
		t.Fatalf("default.toml does not set %v", missing)
	}
}

// documented reports whether text sets key in [section] ("" for the top level).
func documented(text, section, key string) bool {
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			cur = strings.Trim(line, "[]")
			continue
		}
		if cur == section && strings.HasPrefix(line, key+" =") {
			return true
		}
	}
	return false
}
