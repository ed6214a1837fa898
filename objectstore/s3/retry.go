package s3

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// retryPolicy runs an operation up to attempts times, sleeping base, 2*base, 4*base, ... (at
// most 20*base, with +-25% jitter) between attempts that failed transiently.
type retryPolicy struct {
	attempts int
	base     time.Duration
}

func newRetryPolicy(attempts int, base time.Duration) retryPolicy {
	return retryPolicy{attempts: attempts, base: base}
}

// do calls fn until it succeeds, fails with a non-transient error, the attempts run out or
// ctx is done, and returns fn's last error.
func (p retryPolicy) do(ctx context.Context, op string, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || !transient(err) || attempt >= p.attempts || ctx.Err() != nil {
			return err
		}
		wait := p.backoff(attempt)
		log.L(ctx).Debug("s3 request failed, retrying", "op", op, "attempt", attempt, "wait", wait, "error", err)
		if !sleep(ctx, wait) {
			return err
		}
	}
}

func (p retryPolicy) backoff(attempt int) time.Duration {
	d := p.base << min(attempt-1, 16)
	d = min(d, 20*p.base)
	jitter := time.Duration(rand.Int64N(int64(d)/2+1)) - d/4
	return d + jitter
}

// sleep waits for d or until ctx is done; it reports whether the full wait passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
