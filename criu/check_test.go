package criu

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

type fakeRunner struct {
	out []byte
	err error
}

func (f fakeRunner) Run(context.Context, string, ...string) ([]byte, error) { return f.out, f.err }

func version(v int) CheckerOpt {
	return WithVersionFunc(func(string) (int, error) { return v, nil })
}

func TestCheckTooOld(t *testing.T) {
	st := NewChecker("sh", version(31700), WithRunner(fakeRunner{})).Check(context.Background())
	if st.Available || !strings.Contains(st.Reason, "3.17.0 at") || !strings.Contains(st.Reason, "too old") {
		t.Fatalf("want too-old reason, got %+v", st)
	}
}

func TestCheckFails(t *testing.T) {
	r := fakeRunner{out: []byte("Warn: x\nError (criu/vdso.c:123): vdso broken"), err: errors.New("exit status 1")}
	st := NewChecker("sh", version(40101), WithRunner(r)).Check(context.Background())
	if st.Available || st.CheckPassed || !strings.Contains(st.Reason, "vdso broken") {
		t.Fatalf("want check failure naming vdso, got %+v", st)
	}
}

func TestCheckMissingBinary(t *testing.T) {
	st := NewChecker("/nonexistent/criu").Check(context.Background())
	if st.Available || !strings.Contains(st.Reason, "/nonexistent/criu") {
		t.Fatalf("want missing-binary reason, got %+v", st)
	}
}

func TestCheckPasses(t *testing.T) {
	st := NewChecker("sh", version(40101), WithRunner(fakeRunner{out: []byte("Looks good.")})).Check(context.Background())
	if !st.Available || st.VersionString() != "4.1.1" {
		t.Fatalf("want available 4.1.1, got %+v", st)
	}
}

// TestRealCRIU runs the real criu: CI installs CRIU 4.1.1, which must pass its check here.
func TestRealCRIU(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "criu")
	st := NewChecker("criu").Check(context.Background())
	if !st.Available {
		t.Fatalf("real CRIU not usable: %s", st.Reason)
	}
	t.Logf("CRIU %s at %s: %s", st.VersionString(), st.Path, st.CheckOutput)
}
