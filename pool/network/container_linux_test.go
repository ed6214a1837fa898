package network

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/deltabox/deltabox/internal/testutil"
)

const busyboxImage = "deltabox.local/busybox:latest"

type connKey struct{}

// httpServe answers every request with what it saw: method, URI and, for redirected
// connections, the original destination.
func httpServe(t *testing.T, at netip.AddrPort) {
	l, err := net.Listen("tcp4", at.String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			orig, _ := OriginalDst(r.Context().Value(connKey{}).(*net.TCPConn))
			fmt.Fprintf(w, "port %d saw %s %s from %s orig %s\n", at.Port(), r.Method, r.RequestURI, r.RemoteAddr, orig)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
}

// TestContainer runs a real busybox container the way the pool will create it: spec network
// namespace = Attachment.NetNSPath, env = Attachment.Env().
func TestContainer(t *testing.T) {
	addr := testutil.RequiresEnv(t, "DELTABOX_CONTAINERD_ADDRESS")
	m := newRootManager(t, testSubnet)
	ctx := context.Background()
	client, err := containerd.New(addr, containerd.WithDefaultNamespace("deltabox"))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	img, err := client.GetImage(ctx, busyboxImage)
	if err != nil {
		if testutil.InCI() {
			t.Fatalf("image %s: %v (make images builds it)", busyboxImage, err)
		}
		t.Skipf("image %s: %v (make images builds it)", busyboxImage, err)
	}
	att := setup(t, m, "ctr-1")
	httpServe(t, netip.AddrPortFrom(m.Gateway(), testProxyPort))
	httpServe(t, netip.AddrPortFrom(m.Gateway(), testHTTPPort))
	script := strings.Join([]string{
		"wget -q -O- http://example.test/via-proxy",
		"wget -Y off -q -O- http://198.51.100.7/direct",
		"wget -Y off -q -T 1 -O- http://" + netip.AddrPortFrom(m.Gateway(), testOtherPort).String() + "/ || echo other-port-blocked",
		"nslookup -timeout=1 example.test " + m.Gateway().String() + " >/dev/null 2>&1 || echo dns-blocked",
	}, "; ")
	want := []string{
		fmt.Sprintf("port %d saw GET http://example.test/via-proxy from %s:", testProxyPort, att.IP),
		fmt.Sprintf("port %d saw GET /direct from %s:", testHTTPPort, att.IP),
		"orig 198.51.100.7:80",
		"other-port-blocked",
		"dns-blocked",
	}
	out := runContainer(t, ctx, client, img, att, script)
	t.Logf("container output:\n%s", out)
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func runContainer(t *testing.T, ctx context.Context, client *containerd.Client, img containerd.Image, att Attachment, script string) string {
	id := fmt.Sprintf("network-test-%s-%d", att.ID, time.Now().UnixNano())
	c, err := client.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(
			oci.WithImageConfig(img),
			oci.WithProcessArgs("sh", "-c", script),
			oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: att.NetNSPath}),
			oci.WithEnv(att.Env()),
		))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup)
	var buf testutil.SyncBuffer // containerd copies stdout and stderr on two goroutines
	task, err := c.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &buf, &buf)))
	if err != nil {
		t.Fatal(err)
	}
	defer task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
	exit, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exit:
	case <-time.After(30 * time.Second):
		_ = task.Kill(ctx, syscall.SIGKILL)
		<-exit
		t.Error("container timed out")
	}
	// Deleting the task waits for its output to be copied; reading buf earlier races with it.
	if _, err := task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill); err != nil {
		t.Logf("delete task: %v", err)
	}
	return buf.String()
}
