package config

import (
	"errors"
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
