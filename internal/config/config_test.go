package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

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
