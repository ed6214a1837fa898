package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A pipeline file that is valid (or not) locally is so with --engine temporal, with the
// same error, before anything is dialled.
func TestRunTemporalSameValidation(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("pool: bb\nsteps:\n  - name: a\n    run: [true]\n    retry: {attempts: 0, bogus: 1}\n"), 0o644)
	sock := filepath.Join(dir, "none.sock")
	_, local, lcode := runArgs("--address", sock, "run", bad)
	_, remote, rcode := runArgs("run", bad, "--engine", "temporal://127.0.0.1:1")
	if lcode != rcode || local != remote || !strings.Contains(local, "bad.yaml:5") {
		t.Fatalf("local: exit %d %q; temporal: exit %d %q; want the same error naming bad.yaml:5", lcode, local, rcode, remote)
	}
	for _, engine := range []string{"temporal://", "temporal://host", "http://h:1", "temporal://h:1?queue=x", "temporal://h:1?tls=maybe"} {
		if _, errOut, code := runArgs("run", bad, "--engine", engine); code != 2 || !strings.Contains(errOut, "--engine") {
			t.Errorf("--engine %q: exit %d %q; want a usage error naming --engine", engine, code, errOut)
		}
	}
}

// A Temporal address where nothing answers fails the run within 5 s, naming it.
func TestRunTemporalBadAddress(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	os.WriteFile(p, []byte("pool: bb\nsteps:\n  - run: [true]\n"), 0o644)
	l, err := net.Listen("tcp", "127.0.0.1:0") // a port that accepts and never speaks gRPC
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, addr := range []string{"127.0.0.1:1", l.Addr().String()} {
		start := time.Now()
		_, errOut, code := runArgs("run", p, "--engine", "temporal://"+addr)
		if took := time.Since(start); code != 1 || !strings.Contains(errOut, addr) || took > 6*time.Second {
			t.Errorf("temporal at %s: exit %d after %s, stderr %q; want exit 1 within 5 s naming the address", addr, code, took, errOut)
		}
	}
}
