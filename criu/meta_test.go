package criu

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
)

type specFixture struct{ oci.Spec }

func TestCheckCompatible(t *testing.T) {
	local := Status{Version: 40101, Available: true}
	ok := LocalMeta(local)
	if err := CheckCompatible(ok, local); err != nil {
		t.Fatalf("same host: %v", err)
	}
	older := ok
	older.CRIUVersion = 40100
	if err := CheckCompatible(older, local); err != nil {
		t.Fatalf("older CRIU: %v", err)
	}
	cases := map[string]struct {
		mutate func(*Meta, *Status)
		want   string
	}{
		"newer CRIU": {func(m *Meta, _ *Status) { m.CRIUVersion = 40200 }, "CRIU 4.2.0, newer than the local CRIU 4.1.1"},
		"arch":       {func(m *Meta, _ *Status) { m.Arch = otherArch() }, "architecture"},
		"page size":  {func(m *Meta, _ *Status) { m.PageSize = os.Getpagesize() * 16 }, "page size"},
		"no version": {func(m *Meta, _ *Status) { m.CRIUVersion = 0 }, "no CRIU version"},
		"no CRIU":    {func(_ *Meta, s *Status) { s.Available, s.Reason = false, "criu missing" }, "criu missing"},
	}
	for name, c := range cases {
		m, st := ok, local
		c.mutate(&m, &st)
		err := CheckCompatible(m, st)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want FailedPrecondition naming %q, got %v", name, c.want, err)
		}
	}
}

func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}

func TestMetaRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadMeta(dir); !errdefs.IsNotFound(err) {
		t.Fatalf("missing meta: want NotFound, got %v", err)
	}
	m := LocalMeta(Status{Version: 40101})
	m.ContainerID, m.CgroupsPath = "a", "/deltabox/a"
	if err := WriteMeta(dir, m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMeta(dir)
	if err != nil || !got.Created.Equal(m.Created) || got.ContainerID != "a" || got.Kernel == "" {
		t.Fatalf("read back %+v, %v", got, err)
	}
}

func TestDumpErrorClassifiesInotify(t *testing.T) {
	dir := t.TempDir()
	log := "(00.1) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
		"(00.2) Error (criu/fsnotify.c:284): fsnotify: \tCan't dump that handle\n(00.3) Error (criu/cr-dump.c:2111): Dumping FAILED.\n"
	if err := os.WriteFile(dir+"/"+DumpLog, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	err := dumpError("c1", dir, errdefs.ErrUnknown)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "inotify watches on overlayfs cannot be checkpointed by CRIU <= 4.2") ||
		strings.Contains(err.Error(), "RLIMIT") {
		t.Fatalf("got %v", err)
	}
	other := t.TempDir()
	os.WriteFile(other+"/"+DumpLog, []byte("(00.3) Error (criu/file-lock.c:110): Some file locks are hold\n"), 0o600)
	if err := dumpError("c1", other, errdefs.ErrUnknown); errdefs.IsFailedPrecondition(err) || !errdefs.IsUnknown(err) || !strings.Contains(err.Error(), "file locks") {
		t.Fatalf("got %v", err)
	}
}
