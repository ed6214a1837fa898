//go:build linux

package overlay

import (
	"flag"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Every tracked scan of the tests is checked against a walk of the same upper dir (not in
	// benchmarks, which measure the tracked scan alone).
	if b := flag.Lookup("test.bench"); b == nil || b.Value.String() == "" {
		crossCheckTracking = true
	}
	os.Exit(m.Run())
}
