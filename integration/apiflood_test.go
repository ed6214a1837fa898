package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestAPIFloodMemoryIsBounded: 16 parallel 32 MiB request bodies took the daemon from 0.3 to
// 2.8 GB. Now a body over its route's limit is refused before it is read, and the bodies
// held in memory at once share one budget: the flood is answered with resource_exhausted
// (429) and the daemon's peak RSS grows by a bounded amount.
func TestAPIFloodMemoryIsBounded(t *testing.T) {
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	before := peakRSS(t, d.cmd.Process.Pid)

	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.address)
	}}}
	flood := func(size int) map[string]int {
		value := strings.Repeat("x", size)
		body := []byte(`[{"op":"add","path":"/big","value":"` + value + `"}]`)
		var mu sync.Mutex
		codes := map[string]int{}
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				code := statePatchCode(hc, id, body)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			})
		}
		wg.Wait()
		return codes
	}
	big := flood(32 << 20)
	mid := flood(12 << 20)
	after := peakRSS(t, d.cmd.Process.Pid)
	t.Logf("peak RSS %d MiB -> %d MiB; 32 MiB bodies: %v; 12 MiB bodies: %v", before>>20, after>>20, big, mid)
	if big[api.CodeResourceExhausted] == 0 || big[api.CodeResourceExhausted]+big["transport"] != 16 {
		t.Fatalf("32 MiB bodies: %v, want every one refused with resource_exhausted", big)
	}
	if mid[api.CodeResourceExhausted] == 0 {
		t.Fatalf("16 parallel 12 MiB bodies: %v, want some refused by the memory budget", mid)
	}
	if grew := after - before; grew > 600<<20 {
		t.Fatalf("the flood grew the daemon's peak RSS by %d MiB", grew>>20)
	}
	d.cli("exec", id, "--", "true") // and it still serves the sandbox
}

// statePatchCode sends one state patch and returns its error code ("ok", or "transport" when
// the daemon closed the connection while the body was still being sent).
func statePatchCode(hc *http.Client, id string, body []byte) string {
	req, _ := http.NewRequest(http.MethodPost, "http://deltabox/v1/sandboxes/"+id+"/state", bytes.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		return "transport"
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return "ok"
	}
	var eb api.ErrorBody
	if json.NewDecoder(resp.Body).Decode(&eb) != nil {
		return fmt.Sprint(resp.StatusCode)
	}
	return eb.Error.Code
}

// peakRSS returns a process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
