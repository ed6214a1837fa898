package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closedWithin reports whether the server closes c (EOF or reset) within d, after answering
// anything it answers.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	ne, ok := err.(net.Error)
	return !(ok && ne.Timeout())
}

func TestConnectionCapPerSandbox(t *testing.T) {
	up := newUpstream(t, false)
	e := newEnv(t, WithConnLimits(ConnLimits{MaxConns: 20}))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	e.register(3, "sb-b", basePolicy(up.hostPort()))
	var idle []net.Conn
	for i := 0; i < 20; i++ {
		idle = append(idle, dialFrom(t, 2, e.addr))
	}
	waitFor(t, "20 connections counted", func() bool { return e.p.limiter.count(srcIP(2)) == 20 })
	for i := 0; i < 80; i++ { // a hostile sandbox keeps opening idle connections
		c := dialFrom(t, 2, e.addr)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("connection %d over the cap: %v", 21+i, err)
		}
		mustStatus(t, resp, http.StatusTooManyRequests)
		if r := resp.Header.Get(HeaderReason); !strings.Contains(r, "too many open connections from 127.0.0.2") {
			t.Fatalf("reason %q", r)
		}
	}
	if n := e.p.limiter.count(srcIP(2)); n != 20 {
		t.Fatalf("%d connections open, want the cap of 20", n)
	}
	if st, r := getStatus(t, e.client(3), up.URL+"/other-sandbox"); st != 200 {
		t.Fatalf("another sandbox is refused: %d %q", st, r)
	}
	idle[0].Close()
	waitFor(t, "a slot freed by a close", func() bool { return e.p.limiter.count(srcIP(2)) == 19 })
	if st, r := getStatus(t, e.client(2), up.URL+"/after-close"); st != 200 {
		t.Fatalf("after a close: %d %q", st, r)
	}
}

func TestConnectionTimeouts(t *testing.T) {
	up := newUpstream(t, false)
	lim := ConnLimits{HeaderTimeout: 200 * time.Millisecond, BodyTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond}
	e := newEnv(t, WithConnLimits(lim))
	e.register(2, "sb-a", basePolicy(up.hostPort()))

	silent := dialFrom(t, 2, e.addr) // never sends a byte
	half := dialFrom(t, 2, e.addr)
	_, _ = half.Write([]byte("GET " + up.URL + "/slow-headers HTTP/1.1\r\nHost: " + up.hostPort() + "\r\n"))
	kept := dialFrom(t, 2, e.addr)
	resp := roundTripRaw(t, kept, "GET "+up.URL+"/x HTTP/1.1\r\nHost: "+up.hostPort()+"\r\n\r\n")
	mustStatus(t, resp, 200)
	for name, c := range map[string]net.Conn{"silent": silent, "half a header": half, "idle keep-alive": kept} {
		if !closedWithin(c, 3*time.Second) {
			t.Errorf("%s connection still open", name)
		}
	}

	slow := dialFrom(t, 2, e.addr)
	_, _ = slow.Write([]byte("POST " + up.URL + "/held HTTP/1.1\r\nHost: " + up.hostPort() + "\r\nContent-Length: 100\r\n\r\n0123456789"))
	_ = slow.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatalf("slow body: %v", err)
	}
	mustStatus(t, resp, http.StatusRequestTimeout)
	if effs := e.p.Effects("sb-a"); len(effs) != 0 {
		t.Fatalf("a request with a stalled body was journaled: %+v", effs)
	}
	waitFor(t, "every slot released", func() bool { return e.p.limiter.count(srcIP(2)) <= 1 })
}

func TestTunnelSlotReleasedOnClose(t *testing.T) {
	up := newUpstream(t, true)
	e := newEnv(t, WithUpstreamRootsPEM(up.certPEM()), WithConnLimits(ConnLimits{MaxConns: 1}))
	e.register(2, "sb-a", basePolicy(up.hostPort()))
	tc := connectTLS(t, e, up.hostPort(), "127.0.0.1", true)
	mustStatus(t, roundTripRaw(t, tc, "GET /in-tunnel HTTP/1.1\r\nHost: "+up.hostPort()+"\r\n\r\n"), 200)
	if n := e.p.limiter.count(srcIP(2)); n != 1 {
		t.Fatalf("tunnel counts %d connections, want 1", n)
	}
	tc.Close()
	waitFor(t, "the tunnel's slot released", func() bool { return e.p.limiter.count(srcIP(2)) == 0 })
	tc = connectTLS(t, e, up.hostPort(), "127.0.0.1", true)
	mustStatus(t, roundTripRaw(t, tc, "GET /again HTTP/1.1\r\nHost: "+up.hostPort()+"\r\n\r\n"), 200)
}
