//go:build linux

package overlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/testutil"
)

// mapsParsed is what reading and parsing a process's maps file lists as shared writable
// file mappings (the fallback, and the reference the kernel's filtered query must match).
func mapsParsed(t testing.TB, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	parseSharedWritable(b, func(p string) { out = append(out, p) })
	return out
}

// queried is what the PROCMAP_QUERY walk lists for the process.
func queried(t testing.TB, pid int) []string {
	t.Helper()
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var q mapsQuery
	var out []string
	switch q.queryAll(fd, func(p string) { out = append(out, p) }) {
	case queryUnsupported:
		testutil.SkipOrFail(t, "the kernel has no PROCMAP_QUERY (Linux 6.11)")
	case queryFallback:
		t.Fatal("the PROCMAP_QUERY walk failed")
	}
	return out
}

// TestWritableFilesQueryMatchesMaps: the kernel's filtered walk of a process's mappings
// lists exactly the shared writable file mappings that its maps file shows, in order, and
// none of the others (private writable, shared read-only, anonymous ones).
func TestWritableFilesQueryMatchesMaps(t *testing.T) {
	dir := t.TempDir()
	mapFile := func(name string, prot, flags int) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, 8192), 0o644); err != nil {
			t.Fatal(err)
		}
		fh, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		mem, err := unix.Mmap(int(fh.Fd()), 0, 8192, prot, flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(mem) })
	}
	mapFile("shared-rw", unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	mapFile("private-rw", unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	mapFile("shared-ro", unix.PROT_READ, unix.MAP_SHARED)
	mapFile("shared-rw2", unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	anon, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	got, want := queried(t, os.Getpid()), mapsParsed(t, os.Getpid())
	if !slices.Equal(got, want) {
		t.Fatalf("PROCMAP_QUERY lists %q, maps %q", got, want)
	}
	for _, name := range []string{"shared-rw", "shared-rw2"} {
		if !slices.Contains(got, filepath.Join(dir, name)) {
			t.Fatalf("%s missing from %q", name, got)
		}
	}
	for _, name := range []string{"private-rw", "shared-ro"} {
		if slices.Contains(got, filepath.Join(dir, name)) {
			t.Fatalf("%s listed in %q", name, got)
		}
	}
	open := WritableFiles([]int{os.Getpid()})
	if !slices.Contains(open.Mapped, filepath.Join(dir, "shared-rw")) || slices.ContainsFunc(open.Mapped, func(p string) bool { return strings.HasSuffix(p, " (deleted)") }) {
		t.Fatalf("WritableFiles: %+v", open)
	}
}

// bigHeap starts a Python process with about 50 MiB of small objects (the benchmarks' REPL)
// and returns its pid once the heap is built.
func bigHeap(t testing.TB) int {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		testutil.SkipOrFail(t, "python3 is not installed")
	}
	cmd := exec.Command(py, "-c", "import sys\nheap=[str(i)*8 for i in range(700000)]\nprint('ready', flush=True)\nsys.stdin.read()")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 6)
	done := make(chan error, 1)
	go func() { _, err := out.Read(buf); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("python did not build its heap")
	}
	return cmd.Process.Pid
}

// TestWritableFilesBigProcess: a Python process with a 50 MiB heap: the query and maps agree.
func TestWritableFilesBigProcess(t *testing.T) {
	pid := bigHeap(t)
	if got, want := queried(t, pid), mapsParsed(t, pid); !slices.Equal(got, want) {
		t.Fatalf("PROCMAP_QUERY lists %q, maps %q", got, want)
	}
}

// BenchmarkWritableFiles: the open files of a Python process with a 50 MiB heap, as a
// rollback reads them in its frozen window (query), against reading and parsing its maps.
func BenchmarkWritableFiles(b *testing.B) {
	pid := bigHeap(b)
	b.Run("query", func(b *testing.B) {
		for b.Loop() {
			WritableFiles([]int{pid})
		}
	})
	b.Run("maps", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			var maps []byte
			maps, buf = readFD(fd, buf)
			parseSharedWritable(maps, func(string) {})
			unix.Close(fd)
		}
	})
}

// TestWritableFilesLongPath: a file mapped shared and writable whose path is longer than
// PATH_MAX (which PROCMAP_QUERY will not return) is still listed: the process's maps is read.
func TestWritableFilesLongPath(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("d", 250)
	for range 20 { // 20 x 251 bytes: past PATH_MAX (4096)
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(dir, name)) })
	ffd, err := unix.Openat(fd, "mapped", unix.O_RDWR|unix.O_CREAT, 0o644)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ffd)
	if err := unix.Ftruncate(ffd, 4096); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(ffd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	isLong := func(p string) bool { return len(p) > unix.PathMax && strings.HasSuffix(p, "/mapped") }
	if !slices.ContainsFunc(mapsParsed(t, os.Getpid()), isLong) {
		t.Fatal("maps does not list the long path")
	}
	if open := WritableFiles([]int{os.Getpid()}); !slices.ContainsFunc(open.Mapped, isLong) {
		t.Fatalf("WritableFiles misses the long path: %d mapped paths", len(open.Mapped))
	}
}
