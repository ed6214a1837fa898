package testutil

import (
	"fmt"
	"testing"
)

// recorder is a testing.TB that records a skip or a failure instead of ending the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skipf(format string, args ...any)  { r.skipped = fmt.Sprintf(format, args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestRequiresSysctlSkipsOrFails(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		RequiresSysctl(r, "kernel.ostype", "NotLinux")
		if ci == "true" && r.failed == "" || ci == "" && r.skipped == "" {
			t.Errorf("CI=%q: skipped %q, failed %q", ci, r.skipped, r.failed)
		}
		r = &recorder{TB: t}
		RequiresSysctl(r, "kernel.ostype", "Linux")
		if r.failed != "" || r.skipped != "" {
			t.Errorf("CI=%q: kernel.ostype = Linux did not pass: %q %q", ci, r.skipped, r.failed)
		}
		r = &recorder{TB: t}
		RequiresSysctl(r, "no.such.sysctl", "1")
		if r.failed == "" && r.skipped == "" {
			t.Errorf("CI=%q: a missing sysctl passed", ci)
		}
	}
}
