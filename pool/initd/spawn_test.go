//go:build linux

package initd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMergeEnv(t *testing.T) {
	got, err := mergeEnv([]string{"PATH=/bin", "HOME=/root", "A=1"}, []string{"A=2", "B=x=y"}, "/home/u", "t1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/bin", "HOME=/home/u", "A=2", "B=x=y", "DELTABOX_TAG=t1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	got, _ = mergeEnv([]string{"HOME=/root"}, []string{"HOME=/mine"}, "/home/u", "")
	if !slices.Equal(got, []string{"HOME=/mine"}) {
		t.Fatalf("request HOME must win over the user's: %v", got)
	}
	if _, err := mergeEnv(nil, []string{"=x"}, "", ""); err == nil {
		t.Fatal("empty key accepted")
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tool"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o644)
	if p, err := lookPath("tool", "/nonexistent:"+dir, ""); err != nil || p != filepath.Join(dir, "tool") {
		t.Fatalf("tool: %q %v", p, err)
	}
	if p, err := lookPath("./tool", "", dir); err != nil || p != filepath.Join(dir, "tool") {
		t.Fatalf("relative to workdir: %q %v", p, err)
	}
	for name, code := range map[string]int{"data": 127, "missing": 127, dir + "/data": 126, dir + "/missing": 127, dir: 126} {
		_, err := lookPath(name, dir, "")
		var se *startError
		if !errors.As(err, &se) || se.code != code {
			t.Errorf("%s: %v, want start error %d", name, err, code)
		}
	}
}
