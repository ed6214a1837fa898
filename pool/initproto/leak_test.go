package initproto_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

func TestClientLeaksNoGoroutines(t *testing.T) {
	p := startInit(t)
	base := runtime.NumGoroutine()
	for i := range 50 {
		var out bytes.Buffer
		st, err := p.client.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"cat"}},
			bytes.NewReader([]byte(fmt.Sprint(i))), &out, nil)
		if err != nil || st.Code != 0 || out.String() != fmt.Sprint(i) {
			t.Fatalf("exec %d: %+v %q %v", i, st, out.String(), err)
		}
		if _, err := p.client.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	p.client.Exec(ctx, initproto.ExecRequest{Argv: []string{"sleep", "10"}}, nil, nil, nil)
	cancel()
	testutil.WaitFor(t, 5*time.Second, 10*time.Millisecond, "goroutines to return to the baseline", func() bool {
		return runtime.NumGoroutine() <= base+1
	})
}
