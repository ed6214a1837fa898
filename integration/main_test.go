package integration

import (
	"io"
	"log/slog"
	"os"
	"testing"
)

// TestMain keeps the test process's own library logs (network setup in cleanups) off stdout,
// where they would split benchmark result lines; daemons log to their own buffers.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}
