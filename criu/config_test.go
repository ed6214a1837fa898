package criu

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func TestWriteConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "criu.conf")
	if err := WriteConfig(p, Options{TCPClose: true, FileLocks: true, Extra: []string{"ghost-limit 10M"}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want := "# written by deltabox (criu.WriteConfig)\ntcp-close\nfile-locks\nghost-limit 10M\n"
	if string(b) != want {
		t.Fatalf("config:\n%s\nwant:\n%s", b, want)
	}
	if !configHas(p, "file-locks") || configHas(p, "tcp-established") {
		t.Fatal("configHas disagrees with the file")
	}
}

func TestWriteConfigRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, o := range map[string]Options{
		"tcp both":     {TCPEstablished: true, TCPClose: true},
		"dashes":       {Extra: []string{"--tcp-close"}},
		"newline":      {Extra: []string{"a\nb"}},
		"network-lock": {Extra: []string{"network-lock nftables"}},
	} {
		if err := WriteConfig(filepath.Join(dir, "c"), o); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want InvalidArgument, got %v", name, err)
		}
	}
	if err := WriteConfig("relative.conf", Options{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative path: want InvalidArgument, got %v", err)
	}
}

func TestWithConfigSetsAnnotation(t *testing.T) {
	var s specFixture
	if err := WithConfig("/x/criu.conf")(nil, nil, nil, &s.Spec); err != nil {
		t.Fatal(err)
	}
	if s.Annotations[ConfigAnnotation] != "/x/criu.conf" {
		t.Fatalf("annotations %v", s.Annotations)
	}
}
