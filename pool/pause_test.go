package pool

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestPauseRetriesAFreezeRuncCouldNotSettle: runc's "unable to freeze" is tried again, other
// errors are not, and the tries are bounded.
func TestPauseRetriesAFreezeRuncCouldNotSettle(t *testing.T) {
	unsettled := errors.New("OCI runtime pause failed: unable to freeze")
	calls := 0
	err := retryUnsettledFreeze(context.Background(), func() error {
		if calls++; calls < 3 {
			return unsettled
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("settled on the third try: err %v after %d calls", err, calls)
	}
	calls = 0
	other := errors.New("not found")
	if err := retryUnsettledFreeze(context.Background(), func() error { calls++; return other }); !errors.Is(err, other) || calls != 1 {
		t.Fatalf("another error: %v after %d calls, want it at once", err, calls)
	}
	calls = 0
	err = retryUnsettledFreeze(context.Background(), func() error { calls++; return unsettled })
	if !errors.Is(err, unsettled) || calls != pauseAttempts || !strings.Contains(err.Error(), "tried") {
		t.Fatalf("never settles: %v after %d calls, want %d tries", err, calls, pauseAttempts)
	}
}
