//go:build linux

package initd

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	st, err := parseStat(42, []byte("42 (we ird) (name)) S 1 40 39 0 -1 4194560 100 0 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st != (procStat{pid: 42, ppid: 1, pgid: 40, sid: 39, state: 'S'}) {
		t.Fatalf("got %+v", st)
	}
	for _, bad := range []string{"", "42 (x", "42 (x) S a b c", "42 (x) S 1"} {
		if _, err := parseStat(42, []byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestScanProcsFindsSelf(t *testing.T) {
	procs, err := scanProcs("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.pid == os.Getpid() {
			if p.ppid != os.Getppid() || !p.live() {
				t.Fatalf("self: %+v", p)
			}
			return
		}
	}
	t.Fatal("own pid not found in /proc")
}

func TestDescendsFrom(t *testing.T) {
	parents := map[int]int{10: 1, 11: 10, 12: 11, 20: 1, 30: 30}
	roots := map[int]bool{10: true}
	for pid, want := range map[int]bool{10: true, 11: true, 12: true, 20: false, 30: false, 99: false} {
		if got := descendsFrom(pid, parents, roots); got != want {
			t.Errorf("descendsFrom(%d) = %v, want %v", pid, got, want)
		}
	}
}
