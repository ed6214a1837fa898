//go:build linux

package initd

import (
	"strings"
	"testing"
)

func TestLimitWriterBoundsTheLog(t *testing.T) {
	var b strings.Builder
	w := LimitWriter(&b, 10)
	for range 100 {
		if n, err := w.Write([]byte("12345\n")); n != 6 || err != nil {
			t.Fatalf("write = %d, %v", n, err)
		}
	}
	if got := b.String(); got != "12345\ndeltabox-init: log limit reached, further log lines are dropped\n" {
		t.Fatalf("log = %q", got)
	}
}
