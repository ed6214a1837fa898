package integration

import (
	"strings"
	"testing"
	"time"
)

// TestEscapeVerifyNeverOpensASwappedInFIFOOrDevice: verify walks the sandbox's tree while the
// sandbox runs. A sandbox swaps checkpointed regular files with a FIFO and a device node in
// a tight loop while verify runs over and over: every verify ends in bounded time, and the
// FIFO is never opened (a writer blocked on it inside the sandbox would wake up and say so).
func TestEscapeVerifyNeverOpensASwappedInFIFOOrDevice(t *testing.T) {
	d := startDaemon(t)
	d.createPool("vswap", pythonImage, 1)
	l := d.lease("vswap")
	d.copyIn(l.ID, "verify_swap.py", "/tmp/verify_swap.py")
	d.cli("exec", l.ID, "--", "python3", "/tmp/verify_swap.py", "setup")
	var ck struct {
		ID string `json:"id"`
	}
	d.cliJSON(&ck, "checkpoint", "create", l.ID)
	kind := strings.TrimSpace(d.cli("exec", l.ID, "--", "python3", "/tmp/verify_swap.py"))
	raced := 0
	runs := 0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) || runs < 5; runs++ {
		start := time.Now()
		out, errOut, code := d.cliRaw("-o", "json", "verify", l.ID, ck.ID)
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("verify %d took %s with files being swapped (%s swapped in)", runs, took, kind)
		}
		if code != 0 && !strings.Contains(errOut, "does not match checkpoint") {
			t.Fatalf("verify %d failed otherwise than with mismatches: %s %s", runs, out, errOut)
		}
		if strings.Contains(out, "changed during verify") {
			raced++
		}
	}
	t.Logf("special file: %s; %d verifies, %d saw a swap mid-walk", kind, runs, raced)
	if _, _, code := d.cliRaw("exec", l.ID, "--", "test", "-e", "/tmp/v-opened"); code == 0 {
		t.Fatalf("the host opened the FIFO swapped in for a checkpointed file")
	}
	d.cli("info")
}
