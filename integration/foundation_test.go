package integration

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type infoDoc struct {
	Client     struct{ Version, Commit string }
	Daemon     struct{ Version, Commit string }
	Containerd struct {
		Address   string
		Reachable bool
		Version   string
	}
	Runc struct{ Version string }
	CRIU struct {
		Version     string
		CheckPassed bool   `json:"check_passed"`
		L3Available bool   `json:"l3_available"`
		Reason      string `json:"reason"`
	}
	Host struct {
		Kernel         string
		CgroupMode     string `json:"cgroup_mode"`
		Overlayfs      bool
		ChangeTracking string `json:"change_tracking"`
	}
	StateRoot string `json:"state_root"`
}

func TestInfoReportsDependencies(t *testing.T) {
	d := startDaemon(t)
	var info infoDoc
	d.cliJSON(&info, "info")
	if !info.Containerd.Reachable || info.Containerd.Address != d.env.containerd || info.Containerd.Version == "" {
		t.Errorf("containerd not reported reachable: %+v", info.Containerd)
	}
	if !info.CRIU.CheckPassed || !info.CRIU.L3Available || !strings.HasPrefix(info.CRIU.Version, "4.") {
		t.Errorf("CRIU 4.x check should pass on this machine: %+v", info.CRIU)
	}
	if info.Runc.Version == "" || info.Host.Kernel == "" || !info.Host.Overlayfs || info.StateRoot != d.root {
		t.Errorf("incomplete info: %+v", info)
	}
	if info.Daemon.Commit == "" || info.Daemon.Commit != info.Client.Commit {
		t.Errorf("daemon and client commits differ: %+v / %+v", info.Daemon, info.Client)
	}
	if info.Host.ChangeTracking != "fanotify" {
		t.Errorf("change tracking should be available on this machine: %q", info.Host.ChangeTracking)
	}
	text := d.cli("info")
	mustContain(t, "info text", text, "CRIU check:", "passed", "reachable", "Change tracking:")
}

func TestDaemonUnreachableContainerdFailsFast(t *testing.T) {
	e := requireEnv(t)
	dir := shortTempDir(t)
	dead := filepath.Join(dir, "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the socket file stays, nobody answers
	for _, addr := range []string{filepath.Join(dir, "missing.sock"), dead} {
		start := time.Now()
		_, errOut, code := runCLI(e.bin, "daemon", "--root", filepath.Join(dir, "root"),
			"--address", filepath.Join(dir, "api.sock"), "--containerd-address", addr)
		took := time.Since(start)
		if code != 1 || took > 5*time.Second {
			t.Errorf("%s: want exit 1 within 5s, got exit %d after %s", addr, code, took)
		}
		mustContain(t, "daemon error", errOut, addr)
	}
}

func TestDaemonRejectsUnknownConfigKey(t *testing.T) {
	e := requireEnv(t)
	dir := shortTempDir(t)
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("version = 1\n[containerd]\nnamespaec = \"x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runCLI(e.bin, "daemon", "--config", cfg, "--root", filepath.Join(dir, "root"),
		"--address", filepath.Join(dir, "api.sock"), "--containerd-address", e.containerd)
	if code != 1 {
		t.Errorf("want exit 1, got %d", code)
	}
	mustContain(t, "daemon error", errOut, "containerd.namespaec")
}

func TestDaemonNeedsRoot(t *testing.T) {
	e := requireEnv(t)
	dir := shortTempDir(t)
	bin := filepath.Join(dir, "deltabox")
	copyFile(t, e.bin, bin, 0o755)
	for _, next := range []string{"deltabox-cli", "deltabox-daemon"} { // the fast front hands `daemon` to deltabox-cli, which hands it on
		if full := filepath.Join(filepath.Dir(e.bin), next); fileExists(full) {
			copyFile(t, full, filepath.Join(dir, next), 0o755)
		}
	}
	cmd := exec.Command(bin, "daemon", "--root", filepath.Join(dir, "root"), "--address", filepath.Join(dir, "api.sock"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("want exit 1, got %v: %s", err, out)
	}
	mustContain(t, "non-root daemon error", string(out), "needs root")
}

func TestInfoWithoutDaemonNamesSocket(t *testing.T) {
	e := requireEnv(t)
	sock := filepath.Join(shortTempDir(t), "nobody-home.sock")
	_, errOut, code := runCLI(e.bin, "--address", sock, "info")
	if code != 1 {
		t.Errorf("want exit 1, got %d", code)
	}
	mustContain(t, "info error", errOut, sock)
}

func TestDaemonStopsCleanlyOnSIGTERM(t *testing.T) {
	d := startDaemon(t)
	d.stop() // fails the test unless the daemon exits 0 within the timeout
	if _, err := os.Stat(d.address); !os.IsNotExist(err) {
		t.Errorf("socket %s still there after shutdown: %v", d.address, err)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	e := requireEnv(t)
	for _, args := range [][]string{{"no-such-verb"}, {"info", "--no-such-flag"}, {"-o", "xml", "info"}, {"info", "extra"}} {
		if _, _, code := runCLI(e.bin, args...); code != 2 {
			t.Errorf("deltabox %v: want exit 2, got %d", args, code)
		}
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		t.Fatal(err)
	}
}
