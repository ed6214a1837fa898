package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

func TestOffByDefault(t *testing.T) {
	Reset()
	if err := Inject("x/y"); err != nil {
		t.Fatalf("Inject with nothing enabled = %v", err)
	}
}

func TestErrorCountAndOff(t *testing.T) {
	t.Cleanup(Reset)
	if err := Set("a/b=2*error, c/d=sleep(1)"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := Inject("a/b"); !errors.Is(err, ErrInjected) {
			t.Fatalf("hit %d: %v, want ErrInjected", i, err)
		}
	}
	for i := 2; i < 5; i++ { // spent for good, not unlimited again once the count went below 0
		if err := Inject("a/b"); err != nil {
			t.Fatalf("hit %d of 2*error = %v", i, err)
		}
	}
	if err := Inject("c/d"); err != nil {
		t.Fatalf("sleep = %v", err)
	}
	if err := Enable("c/d", "off"); err != nil {
		t.Fatal(err)
	}
	if active.Load() == nil {
		t.Fatal("a/b was disabled with c/d")
	}
}

func TestBadSpec(t *testing.T) {
	t.Cleanup(Reset)
	for _, spec := range []string{"nope", "a=explode", "a=0*error", "a=sleep(x)"} {
		if err := Set(spec); err == nil {
			t.Errorf("Set(%q) accepted", spec)
		}
	}
}

// TestExitFromEnv runs this test binary with the variable set: the process must exit 137.
func TestExitFromEnv(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		_ = Inject("child/exit")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=TestExitFromEnv")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", EnvVar+"=child/exit=exit")
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitCode {
		t.Fatalf("child exited with %v, want status %d", err, ExitCode)
	}
}

func BenchmarkInjectOff(b *testing.B) {
	Reset()
	for i := 0; i < b.N; i++ {
		_ = Inject("rollback/after-files")
	}
}
