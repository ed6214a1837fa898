package integration

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sort"
	"testing"
	"time"
)

func BenchmarkZZHTTP(b *testing.B) {
	d := startDaemon(b)
	d.createPool("py", pythonImage, 1)
	id := d.lease("py").ID
	c, ctx := d.client(), context.Background()
	p50 := func(name string, f func()) {
		var s []time.Duration
		for i := 0; i < 300; i++ {
			t := time.Now()
			f()
			s = append(s, time.Since(t))
		}
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		b.Logf("%s p50 %v p90 %v", name, s[150], s[270])
	}
	p50("info", func() { _, _ = c.Info(ctx) })
	p50("sandbox", func() { _, _ = c.Sandbox(ctx, id) })
	conn, err := net.Dial("unix", d.address)
	if err != nil {
		b.Fatal(err)
	}
	br := bufio.NewReader(conn)
	p50("raw", func() {
		req, _ := http.NewRequest("GET", "http://x/v1/info", nil)
		_ = req.Write(conn)
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			b.Fatal(err)
		}
		var buf [4096]byte
		for {
			if _, err := resp.Body.Read(buf[:]); err != nil {
				break
			}
		}
		resp.Body.Close()
	})
	p50("info", func() { _, _ = c.Info(ctx) })
}
