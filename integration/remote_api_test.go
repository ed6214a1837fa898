package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deltabox/deltabox/internal/testutil"
	"github.com/deltabox/deltabox/orchestrator/api"
)

const (
	remoteTokenA = "remote-token-aaaaaaaaaaaaaaaa"
	remoteTokenB = "remote-token-bbbbbbbbbbbbbbbb"
)

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestRemoteAPI serves the host API on TCP ([api] tcp_address) with a self-signed certificate
// and a tokens file, and drives it with the CLI, the Python SDK and the TypeScript SDK: the
// right token works, a wrong one is refused with 401 and logged without the token, a client
// that does not trust the certificate is refused, and a rotated tokens file takes effect
// without a restart.
func TestRemoteAPI(t *testing.T) {
	ts := npmBuild(t, "sdk/typescript")[0]
	dir := shortTempDir(t)
	tokens := filepath.Join(dir, "tokens")
	tokenFile := filepath.Join(dir, "my-token")
	os.WriteFile(tokens, []byte("# CI\n"+remoteTokenA+"\n"), 0o600)
	os.WriteFile(tokenFile, []byte(remoteTokenA+"\n"), 0o600)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := startDaemonWith(t, fmt.Sprintf("[api]\ntcp_address = %q\ntokens_file = %q\n", addr, tokens))
	d.createPool("rp", busyboxImage, 1, "--max", "4")
	ca := filepath.Join(d.root, "api-tls", "cert.pem")
	mustContain(t, "daemon log", d.logs.String(), "api tcp listener started", "tls_fingerprint_sha256=")
	var info api.Info
	d.cliJSON(&info, "info")
	if ra := info.RemoteAPI; ra == nil || ra.Address != addr || ra.Certificate != ca || len(ra.TLSFingerprint) != 95 ||
		!strings.Contains(d.logs.String(), "tls_fingerprint_sha256="+ra.TLSFingerprint) {
		t.Fatalf("info's remote_api: %+v", info.RemoteAPI)
	}
	mustContain(t, "deltabox info", d.cli("info"), "Remote API", info.RemoteAPI.TLSFingerprint)

	remote := []string{"--address", "tcp://" + addr, "--token-file", tokenFile, "--ca-file", ca}
	cli := func(env []string, args ...string) (string, string, int) {
		cmd := exec.Command(d.env.bin, append(append([]string{}, remote...), args...)...)
		cmd.Env = append(os.Environ(), env...)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), code
	}
	out, errOut, code := cli(nil, "-o", "json", "lease", "--pool", "rp")
	if code != 0 {
		t.Fatalf("lease over TCP: exit %d: %s", code, errOut)
	}
	id := jsonField(t, out, "sandbox")
	if out, errOut, code = cli(nil, "exec", id, "--", "sh", "-c", "echo over tcp"); code != 0 || out != "over tcp\n" {
		t.Fatalf("exec over TCP: exit %d %q %s", code, out, errOut)
	}

	wrong := "wrong-token-0123456789abcdef"
	_, errOut, code = cli([]string{"DELTABOX_TOKEN=" + wrong}, "info")
	if code == 0 || !strings.Contains(errOut, "unauthenticated") && !strings.Contains(errOut, "401") {
		t.Fatalf("a wrong token: exit %d: %s", code, errOut)
	}
	if code, errOut := runRaw(t, d.env.bin, nil, "--address", "tcp://"+addr, "--token-file", tokenFile, "info"); code == 0 ||
		!strings.Contains(errOut, "certificate") {
		t.Fatalf("a client that does not trust the self-signed certificate: exit %d: %s", code, errOut)
	}
	if code, errOut := runRaw(t, d.env.bin, nil, "--address", "tcp://"+addr, "--ca-file", ca, "info"); code == 0 ||
		!strings.Contains(errOut, "needs a token") {
		t.Fatalf("no token: exit %d: %s", code, errOut)
	}
	testutil.WaitFor(t, 10*time.Second, 20*time.Millisecond, "the refusal in the daemon log", func() bool {
		return strings.Contains(d.logs.String(), "api request refused")
	})
	logs := d.logs.String()
	mustContain(t, "daemon log", logs, `reason="token not accepted"`)
	for _, secret := range []string{wrong, remoteTokenA} {
		if strings.Contains(logs, secret) {
			t.Fatalf("the daemon log shows a token")
		}
	}

	// Python SDK over TCP, straight from the source tree.
	sdk, _ := filepath.Abs("../sdk/python")
	py := fmt.Sprintf(`
import deltabox
c = deltabox.Client(%[1]q, token_file=%[2]q, ca_file=%[3]q)
with c.lease("rp") as sb:
    print(sb.exec("echo py").text.strip(), repr(c.transport))
try:
    deltabox.Client(%[1]q, token=%[4]q, ca_file=%[3]q).info()
except deltabox.Unauthenticated as e:
    print("refused", e.status)
`, "tcp://"+addr, tokenFile, ca, wrong)
	out = runTool(t, "", []string{"PYTHONPATH=" + sdk}, "python3", "-c", py)
	mustContain(t, "python over tcp", out, "py Transport('tcp://"+addr+"')", "refused 401")
	if strings.Contains(out, remoteTokenA) {
		t.Fatalf("the Python SDK printed its token: %s", out)
	}

	// TypeScript SDK over TCP.
	js := fmt.Sprintf(`
import { Client, UnauthenticatedError } from %[5]q;
const c = new Client({ address: %[1]q, tokenFile: %[2]q, caFile: %[3]q });
await c.withLease("rp", async (sb) => console.log((await sb.exec("echo ts")).text.trim()));
c.close();
try { await new Client({ address: %[1]q, token: %[4]q, caFile: %[3]q }).info(); }
catch (e) { console.log("refused", e instanceof UnauthenticatedError, e.status); }
`, "tcp://"+addr, tokenFile, ca, wrong, filepath.Join(ts, "dist", "index.js"))
	out = runTool(t, "", nil, "node", "--input-type=module", "-e", js)
	mustContain(t, "node over tcp", out, "ts\n", "refused true 401")

	// Rotation: B replaces A in the tokens file; no restart.
	os.WriteFile(tokens+".new", []byte(remoteTokenB+"\n"), 0o600)
	os.Rename(tokens+".new", tokens)
	time.Sleep(300 * time.Millisecond)
	if _, errOut, code := cli(nil, "info"); code == 0 {
		t.Fatalf("the rotated-out token still works")
	} else if !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("the rotated-out token: %s", errOut)
	}
	if _, errOut, code := cli([]string{"DELTABOX_TOKEN=" + remoteTokenB}, "release", id); code != 0 {
		t.Fatalf("the rotated-in token: exit %d: %s", code, errOut)
	}
}

// runRaw runs a command with extra environment; its exit code and stderr.
func runRaw(t *testing.T, bin string, env []string, args ...string) (int, string) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), errOut.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, errOut.String()
}

// jsonField returns a string field of a JSON object.
func jsonField(t *testing.T, s, field string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	v, _ := m[field].(string)
	if v == "" {
		t.Fatalf("no %q in %s", field, s)
	}
	return v
}
