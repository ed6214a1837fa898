package initd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
)

func writeEtc(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	passwd := "root:x:0:0:root:/root:/bin/sh\n# comment\nalice:x:1000:1000:Alice:/home/alice:/bin/sh\nbroken line\n"
	group := "root:x:0:\nalice:x:1000:\nwheel:x:10:bob,alice\ndocker:x:999:bob\n"
	os.WriteFile(filepath.Join(dir, "passwd"), []byte(passwd), 0o644)
	os.WriteFile(filepath.Join(dir, "group"), []byte(group), 0o644)
	return dir
}

func TestLookupIdentity(t *testing.T) {
	etc := writeEtc(t)
	for _, tc := range []struct {
		spec     string
		uid, gid uint32
		groups   []uint32
		home     string
	}{
		{"alice", 1000, 1000, []uint32{10}, "/home/alice"},
		{"1000", 1000, 1000, []uint32{10}, "/home/alice"},
		{"alice:docker", 1000, 999, []uint32{10}, "/home/alice"},
		{"4242", 4242, 0, []uint32{}, ""},
		{"4242:77", 4242, 77, []uint32{}, ""},
		{"0:0", 0, 0, []uint32{}, "/root"},
	} {
		id, err := lookupIdentity(etc, tc.spec)
		if err != nil {
			t.Errorf("%s: %v", tc.spec, err)
			continue
		}
		if id.uid != tc.uid || id.gid != tc.gid || !slices.Equal(id.groups, tc.groups) || id.home != tc.home {
			t.Errorf("%s: got %+v, want uid %d gid %d groups %v home %q", tc.spec, id, tc.uid, tc.gid, tc.groups, tc.home)
		}
	}
}

func TestLookupIdentityErrors(t *testing.T) {
	etc := writeEtc(t)
	for spec, class := range map[string]error{
		"mallory":     errdefs.ErrNotFound,
		"alice:nogrp": errdefs.ErrNotFound,
		":1":          errdefs.ErrInvalidArgument,
		"alice:":      errdefs.ErrInvalidArgument,
	} {
		if _, err := lookupIdentity(etc, spec); !errors.Is(err, class) {
			t.Errorf("%q: got %v, want %v", spec, err, class)
		}
	}
}

func TestLookupIdentityWithoutEtcFiles(t *testing.T) {
	id, err := lookupIdentity(t.TempDir(), "123:456")
	if err != nil || id.uid != 123 || id.gid != 456 {
		t.Fatalf("got %+v %v", id, err)
	}
	if _, err := lookupIdentity(t.TempDir(), "alice"); !errdefs.IsNotFound(err) {
		t.Fatalf("name without passwd: %v", err)
	}
}
