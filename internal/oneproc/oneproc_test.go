package oneproc

import (
	"os"
	"runtime"
	"testing"
)

// The package's initialiser ran before the test: one P, unless GOMAXPROCS was set.
func TestOneP(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set: it wins, by design") // nothing to check: the environment decides
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("GOMAXPROCS is %d after oneproc's init, want 1", n)
	}
}
