//go:build linux

package criu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/testutil"
)

// sumScript holds 50 MiB of random heap and its SHA-256 (taken at start), counts in
// /tmp/count, and on every request (a new /tmp/check) hashes the heap again into /tmp/sum:
// a restore that lost or zeroed a page gives another sum.
const sumScript = `import hashlib, os, time
heap = bytearray(os.urandom(50 << 20))
want = hashlib.sha256(heap).hexdigest()
fd = os.open("/tmp/count", os.O_WRONLY | os.O_CREAT, 0o644)
i, seen = 0, 0
while True:
    i += 1
    os.pwrite(fd, b"%011d\n" % i, 0)
    try:
        n = os.stat("/tmp/check").st_mtime_ns
    except FileNotFoundError:
        n = 0
    if n != seen:
        seen = n
        got = hashlib.sha256(heap).hexdigest()
        with open("/tmp/sum.new", "w") as f:
            f.write(("ok " if got == want else "BAD ") + got)
        os.rename("/tmp/sum.new", "/tmp/sum")
    time.sleep(0.02)
`

// TestLazyRestore: a lazy restore (pages served by `criu lazy-pages` after the processes run)
// of a python process with 50 MiB of random heap brings back every byte of it, twice, and the
// eager restore of the same images (lazy off) does too; the configuration file loses
// "lazy-pages" right after each restore, so the next dump is a plain one.
func TestLazyRestore(t *testing.T) {
	e := newEnv(t)
	e.cp = New(e.client, WithLazyPages(true), WithWorkRoot(t.TempDir()))
	sb := e.newSandbox(t, pythonImage, "exec python3 "+runPath+"/sum.py", Options{TCPEstablished: true}, withRunFile("sum.py", sumScript))
	sb.waitCount(t, "python heap counter", func(n int) bool { return n > 2 })
	conf, err := ConfigOf(e.ctx, sb.ctr)
	if err != nil || conf == "" {
		t.Fatalf("config of the sandbox: %q %v", conf, err)
	}
	checkSum := func(what string) {
		t.Helper()
		os.Remove(sb.path("/tmp/sum"))
		if err := os.WriteFile(sb.path("/tmp/check"), []byte(what), 0o644); err != nil {
			t.Fatal(err)
		}
		var got string
		testutil.WaitFor(t, 20*time.Second, 20*time.Millisecond, "the heap's sum "+what, func() bool {
			b, err := os.ReadFile(sb.path("/tmp/sum"))
			got = string(b)
			return err == nil
		})
		if !strings.HasPrefix(got, "ok ") {
			t.Fatalf("heap after %s: %s", what, got)
		}
	}
	checkSum("start")
	for round, lazy := range []bool{true, true, false} {
		e.cp.lazy = lazy
		before := e.cp.LazyRestores()
		images := filepath.Join(t.TempDir(), "images")
		if _, err := e.cp.Dump(e.ctx, sb.id, images); err != nil {
			t.Fatalf("round %d: dump: %v", round, err)
		}
		dumped := sb.count()
		e.kill(t, sb)
		took := e.restore(t, sb, images)
		os.RemoveAll(images) // the page server has its own links to the images
		if got := e.cp.LazyRestores() - before; (got == 1) != lazy {
			t.Fatalf("round %d: lazy restores %d, want lazy=%v", round, got, lazy)
		}
		if b, err := os.ReadFile(conf); err != nil || strings.Contains(string(b), lazyOption) {
			t.Fatalf("round %d: the CRIU configuration after the restore: %q %v", round, b, err)
		}
		sb.waitCount(t, "restored counter", func(n int) bool { return n > dumped && n <= dumped+100 })
		checkSum("restore " + string(rune('0'+round)))
		t.Logf("round %d (lazy %v): restore %s", round, lazy, took)
	}
}

// TestLazyServerFailureKillsTheTask: a page server that fails (or ends with an error) gets
// the restored task killed, and the work directory removed.
func TestLazyServerFailureKillsTheTask(t *testing.T) {
	for _, code := range []int{0, 3} {
		work := t.TempDir()
		cmd := exec.Command("sh", "-c", "exit "+string(rune('0'+code)))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		l := &lazyServer{cmd: cmd, work: work, done: make(chan error, 1), finished: make(chan struct{})}
		go func() { l.done <- cmd.Wait() }()
		killed, released := false, false
		l.watch(context.Background(), "c", func() error { killed = true; return nil }, func() { released = true })
		select {
		case <-l.finished:
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not finish")
		}
		if killed != (code != 0) || !released {
			t.Fatalf("exit %d: task killed %v, pidfd released %v", code, killed, released)
		}
		if _, err := os.Stat(work); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("exit %d: work dir left: %v", code, err)
		}
	}
}

// TestKillInitReachesOnlyThatProcess: the kill watch gets signals the process it was made
// for, and once that process is gone it cannot reach whatever runs under its pid later.
func TestKillInitReachesOnlyThatProcess(t *testing.T) {
	p := exec.Command("sleep", "100")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	kill, release, err := killInit(uint32(p.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("sleep after the kill: %v", err)
	}
	if err := kill(); err == nil {
		t.Fatal("a kill after the process was reaped succeeded")
	}
}

// TestLazyUsable: lazy only where the restored processes may make a userfaultfd.
func TestLazyUsable(t *testing.T) {
	dir := t.TempDir()
	old := unprivilegedUFFD
	t.Cleanup(func() { unprivilegedUFFD = old })
	unprivilegedUFFD = filepath.Join(dir, "u")
	plain := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}}}
	userns := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.UserNamespace}}}}
	for _, c := range []struct {
		spec *specs.Spec
		sys  string
		want bool
	}{{plain, "0", true}, {userns, "0", false}, {userns, "", false}, {userns, "1", true}, {nil, "1", false}} {
		os.Remove(unprivilegedUFFD)
		if c.sys != "" {
			os.WriteFile(unprivilegedUFFD, []byte(c.sys+"\n"), 0o644)
		}
		if got, why := LazyUsable(c.spec); got != c.want || (!got && why == "") {
			t.Errorf("spec %v sysctl %q: %v (%q), want %v", c.spec != nil, c.sys, got, why, c.want)
		}
	}
}

// TestStripLazyLines drops exactly the lazy-pages lines.
func TestStripLazyLines(t *testing.T) {
	in := "# c\ntcp-established\nlazy-pages\n--lazy-pages\nfile-locks\n"
	if got := string(stripLazyLines([]byte(in))); got != "# c\ntcp-established\nfile-locks\n" {
		t.Fatalf("%q", got)
	}
}
