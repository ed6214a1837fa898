//go:build linux

package criu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/pool/initproto"
)

// The sandbox layout the pool uses: the static init bind-mounted read-only, a host run
// directory bind-mounted read-write, init listening on a unix socket in it.
const (
	testNamespace = "deltabox"
	busyboxImage  = "deltabox.local/busybox:latest"
	pythonImage   = "deltabox.local/python:3"
	initPath      = "/.deltabox/init"
	runPath       = "/.deltabox/run"
	snapshotter   = "overlayfs"
	// testTimeout bounds the containerd calls of one test or benchmark (see newEnv).
	testTimeout = 5 * time.Minute
	// The counter overwrites /tmp/count in place with a fixed-width number, so the file keeps
	// its size: a process dumped while it has the file open and left running must find it the
	// same size at restore (CRIU checks), which `echo > file` (truncate, then write) broke when
	// the dump fell between the two.
	counterScript = `i=0; while true; do i=$((i+1)); printf '%011d\n' $i | dd of=/tmp/count bs=12 count=1 conv=notrunc 2>/dev/null; sleep 0.05; done`
)

var (
	initOnce sync.Once
	initBin  string
	initErr  error
	initDir  string
)

// testInit returns a static deltabox-init: $DELTABOX_INIT_BIN (make test) or one built once.
func testInit(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("DELTABOX_INIT_BIN"); p != "" {
		return p
	}
	initOnce.Do(func() {
		initDir, initErr = os.MkdirTemp("", "criutest-init-")
		if initErr != nil {
			return
		}
		initBin = filepath.Join(initDir, "deltabox-init")
		cmd := exec.Command("go", "build", "-o", initBin, "github.com/deltabox/deltabox/cmd/deltabox-init")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			initErr = fmt.Errorf("build deltabox-init: %v: %s", err, out)
		}
	})
	if initErr != nil {
		t.Fatal(initErr)
	}
	return initBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if initDir != "" {
		os.RemoveAll(initDir)
	}
	os.Exit(code)
}

// env is a containerd client for root tests.
type env struct {
	ctx    context.Context
	client *containerd.Client
	cp     *Checkpointer
	init   string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "criu")
	testutil.RequiresBinary(t, "runc")
	addr := testutil.RequiresEnv(t, "DELTABOX_CONTAINERD_ADDRESS")
	client, err := containerd.New(addr, containerd.WithDefaultNamespace(testNamespace))
	if err != nil {
		t.Fatalf("connect containerd: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	// Every containerd call of a test is bounded: a CRIU dump or restore, or a task delete
	// waiting for an exit, that hangs fails the test (naming the call) instead of the package
	// timeout ending every test after it. Registered first, the cancel runs after the
	// sandboxes' cleanups.
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), testNamespace), testTimeout)
	t.Cleanup(cancel)
	return &env{ctx: ctx, client: client, cp: New(client), init: testInit(t)}
}

// sandbox is one test container with a running task.
type sandbox struct {
	id     string
	dir    string // host dir: run/, criu.conf, logs
	runDir string
	ctr    containerd.Container
	task   containerd.Task
}

func uniqueID(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "criutest-" + hex.EncodeToString(b)
}

// newContainer creates (but does not start) a sandbox container running script next to init,
// with its own CRIU configuration file written from cfg.
func (e *env) newContainer(t testing.TB, image, script string, cfg Options, extra ...oci.SpecOpts) *sandbox {
	t.Helper()
	return e.newContainerIn(t, image, script, cfg, nil, extra...)
}

// newContainerIn is newContainer in a user namespace mapping the sandbox's ids 0-65535 onto
// host ids ids.HostID..: the rootfs snapshot is remapped, the run directory owned by the
// mapped root; ids nil is newContainer.
func (e *env) newContainerIn(t testing.TB, image, script string, cfg Options, ids *specs.LinuxIDMapping, extra ...oci.SpecOpts) *sandbox {
	t.Helper()
	sb := &sandbox{id: uniqueID(t), dir: t.TempDir()}
	sb.runDir = filepath.Join(sb.dir, "run")
	if err := os.Mkdir(sb.runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(sb.dir, "criu.conf")
	if err := WriteConfig(conf, cfg); err != nil {
		t.Fatal(err)
	}
	img, err := e.client.GetImage(e.ctx, image)
	if err != nil {
		t.Fatalf("image %s (import it with hack/images.sh): %v", image, err)
	}
	if ok, _ := img.IsUnpacked(e.ctx, snapshotter); !ok {
		if err := img.Unpack(e.ctx, snapshotter); err != nil {
			t.Fatal(err)
		}
	}
	specOpts := append([]oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs("/bin/sh", "-c", "("+script+") & exec "+initPath+" --socket "+runPath+"/init.sock"),
		oci.WithMounts([]specs.Mount{
			{Destination: initPath, Type: "bind", Source: e.init, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
			{Destination: runPath, Type: "bind", Source: sb.runDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		}),
		WithConfig(conf),
	}, extra...)
	snap := containerd.WithNewSnapshot(sb.id, img)
	if ids != nil {
		// idmapped lower layers, as the pool makes them (no chown of a copy, which a test
		// killed midway would leave behind for every later run)
		maps := []specs.LinuxIDMapping{*ids}
		snap = containerd.WithNewSnapshot(sb.id, img, containerd.WithUserNSRemapperLabels(maps, maps))
		specOpts = append(specOpts, oci.WithUserNamespace(maps, maps))
		// The mapped root must reach the bind sources: the run directory is its own, the
		// directories above it searchable.
		if err := os.Chown(sb.runDir, int(ids.HostID), int(ids.HostID)); err != nil {
			t.Fatal(err)
		}
		for d := sb.dir; d != "/" && d != "."; d = filepath.Dir(d) {
			if info, err := os.Stat(d); err == nil && info.Mode().Perm()&0o001 == 0 {
				if err := os.Chmod(d, info.Mode().Perm()|0o011); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	sb.ctr, err = e.client.NewContainer(e.ctx, sb.id,
		containerd.WithImage(img), containerd.WithSnapshotter(snapshotter), snap,
		containerd.WithRuntime("io.containerd.runc.v2", nil), containerd.WithNewSpec(specOpts...))
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	t.Cleanup(func() { e.destroy(t, sb.ctr) })
	return sb
}

// newSandbox creates a sandbox container and starts it; init answers when it returns.
func (e *env) newSandbox(t testing.TB, image, script string, cfg Options, extra ...oci.SpecOpts) *sandbox {
	t.Helper()
	sb := e.newContainer(t, image, script, cfg, extra...)
	task, err := sb.ctr.NewTask(e.ctx, cio.LogFile(filepath.Join(sb.dir, "task.log")))
	if err != nil {
		t.Fatalf("new task: %v", err)
	}
	if err := task.Start(e.ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	sb.task = task
	e.waitInit(t, sb)
	return sb
}

func (e *env) waitInit(t testing.TB, sb *sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	if _, err := initproto.New(filepath.Join(sb.runDir, "init.sock")).WaitReady(ctx, 5*time.Millisecond); err != nil {
		log, _ := os.ReadFile(filepath.Join(sb.dir, "task.log"))
		t.Fatalf("init of %s does not answer: %v (log %q)", sb.id, err, log)
	}
}

// restore restores sb's container from dir with the Checkpointer and records the new task.
func (e *env) restore(t testing.TB, sb *sandbox, dir string) time.Duration {
	t.Helper()
	start := time.Now()
	task, err := e.cp.Restore(e.ctx, sb.id, dir, cio.LogFile(filepath.Join(sb.dir, "task-restored.log")))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("restore %s: %v", sb.id, err)
	}
	sb.task = task
	return took
}

// kill kills and deletes sb's task, keeping the container and its snapshot.
func (e *env) kill(t testing.TB, sb *sandbox) {
	t.Helper()
	if err := killTask(e.ctx, sb.ctr); err != nil {
		t.Fatal(err)
	}
	sb.task = nil
}

func (e *env) destroy(t testing.TB, c containerd.Container) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 30*time.Second)
	defer cancel()
	if err := killTask(ctx, c); err != nil {
		t.Errorf("cleanup %s: %v", c.ID(), err)
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		t.Errorf("delete %s: %v", c.ID(), err)
	}
}

func killTask(ctx context.Context, c containerd.Container) error {
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete task %s: %w", c.ID(), err)
	}
	return nil
}

// path returns the host path of name inside sb's running task.
func (sb *sandbox) path(name string) string {
	return fmt.Sprintf("/proc/%d/root%s", sb.task.Pid(), name)
}

// count reads the counter a sandbox's script writes to /tmp/count (0 when unreadable).
func (sb *sandbox) count() int {
	b, err := os.ReadFile(sb.path("/tmp/count"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func (sb *sandbox) waitCount(t testing.TB, what string, cond func(int) bool) int {
	t.Helper()
	var n int
	testutil.WaitFor(t, 10*time.Second, 10*time.Millisecond, what, func() bool {
		n = sb.count()
		return cond(n)
	})
	return n
}

// upperDir returns the overlay upper directory of a container's snapshot.
func (e *env) upperDir(t testing.TB, id string) string {
	t.Helper()
	mounts, err := e.client.SnapshotService(snapshotter).Mounts(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return v
			}
		}
	}
	t.Fatalf("no upperdir in the mounts of %s: %+v", id, mounts)
	return ""
}

// copyTree copies src's contents into dst with cp -a (test-only).
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src+"/.", dst+"/").CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
}

// cgroupOf returns /proc/pid/cgroup.
func cgroupOf(t testing.TB, pid uint32) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
