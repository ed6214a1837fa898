package oneproc

import (
	"os"
	"runtime"
	"testing"

	"github.com/deltabox/deltabox/internal/testutil"
)

// The package's initialiser ran before the test: one P, unless GOMAXPROCS was set.
func TestOneP(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		testutil.SkipOrFail(t, "GOMAXPROCS is set: it wins, by design") // CI must not set it
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("GOMAXPROCS is %d after oneproc's init, want 1", n)
	}
}
