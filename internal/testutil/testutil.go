// Package testutil holds the skip helpers and polling helpers shared by DeltaBox's three test
// tiers (unit, root, integration). Outside CI a missing privilege or dependency skips a test
// with a reason; with CI=true it fails it, so CI can never pass by skipping.
package testutil

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// InCI reports whether the tests run under CI (CI=true), where skips are failures.
func InCI() bool { return os.Getenv("CI") == "true" }

// skipOrFail skips t outside CI and fails it in CI.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true, cannot skip: "+format, args...)
	}
	t.Skipf(format, args...)
}

// SkipOrFail skips t outside CI and fails it in CI: for a test that cannot make its point on
// this machine (a missing feature, a newer dependency that no longer shows the bug).
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	skipOrFail(t, format, args...)
}

// RequiresRoot skips (or fails in CI) a test that needs root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "test requires root")
	}
}

// RequiresBinary skips (or fails in CI) a test when name is not on PATH; it returns the path.
func RequiresBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		skipOrFail(t, "test requires %s on PATH (run hack/install-deps.sh)", name)
	}
	return p
}

// RequiresEnv skips (or fails in CI) a test when the environment variable is unset; it returns
// the value.
func RequiresEnv(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		skipOrFail(t, "test requires $%s (set by make test)", name)
	}
	return v
}

// RequiresSysctl skips (or fails in CI) a test unless the sysctl name (net.bridge.x, as for
// sysctl(8)) reads want.
func RequiresSysctl(t testing.TB, name, want string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
	v, err := os.ReadFile(path)
	if err != nil {
		skipOrFail(t, "test requires sysctl %s = %s: %v", name, want, err)
		return
	}
	if got := strings.TrimSpace(string(v)); got != want {
		skipOrFail(t, "test requires sysctl %s = %s (it is %s)", name, want, got)
	}
}

// WaitFor polls cond every interval until it returns true or timeout passes, then fails t.
func WaitFor(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: a command's or container's stdout and
// stderr copied on their own goroutines, or written while a test reads it. Two unsynchronized
// writers corrupt a plain Buffer.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
