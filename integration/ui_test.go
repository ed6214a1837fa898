package integration

import (
	"bufio"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deltabox/deltabox/internal/testutil"
)

// TestTimeTravelUI loads `deltabox ui`'s page in a real headless Chromium (Debian's, installed
// by hack/chromium.sh) for a sandbox with a small tree, clicks a checkpoint, sees its diff,
// rolls back through the page and checks that the sandbox moved. API calls without the page's
// token are refused.
func TestTimeTravelUI(t *testing.T) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		testutil.SkipOrFail(t, "chromium is not installed (hack/chromium.sh): %v", err)
		return
	}
	d := startDaemon(t)
	d.createPool("bb", busyboxImage, 1)
	id := d.lease("bb").ID
	d.cli("exec", id, "--", "sh", "-c", "mkdir -p /w && echo one > /w/f")
	d.cli("checkpoint", "create", id, "--name", "one")
	d.cli("exec", id, "--", "sh", "-c", "echo two > /w/f && echo new > /w/g")
	d.cli("checkpoint", "create", id, "--name", "two")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ui := exec.CommandContext(ctx, d.env.bin, "--address", d.address, "ui", id, "--listen", "127.0.0.1:0")
	out, err := ui.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ui.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = ui.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("deltabox ui printed no URL: %v", err)
	}
	pageURL := strings.TrimSpace(line)
	base := pageURL[:strings.Index(pageURL, "/?")]
	if resp, err := http.Get(base + "/v1/sandboxes"); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("API call without the token: %v %v, want 403", resp, err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Flag("headless", true), chromedp.DisableGPU)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 30*time.Second)
	defer tcancel()
	poll := func(expr string) chromedp.Action[chromedp.Void] { return chromedp.Poll[chromedp.Void](expr) }
	err = chromedp.Do(bctx,
		chromedp.Navigate(pageURL),
		chromedp.WaitVisible(chromedp.CSS(`button.ckpt[data-ckpt="3"]`)),
		chromedp.Click(chromedp.CSS(`button.ckpt[data-ckpt="3"]`)),
		poll(`document.getElementById("files").textContent.includes("/w/g")`),
	)
	if err != nil {
		dctx, dcancel := chromedp.NewContext(actx) // a fresh tab: show what the page shows
		defer dcancel()
		dctx, tcancel := context.WithTimeout(dctx, 10*time.Second)
		defer tcancel()
		_ = chromedp.Do(dctx, chromedp.Navigate(pageURL), chromedp.Sleep(3*time.Second))
		html, herr := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS(`body`)))
		t.Fatalf("browser: load the page and select checkpoint 3: %v\npage (%v): %.3000s", err, herr, html)
	}
	files, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#files`)))
	if err != nil {
		t.Fatal(err)
	}
	err = chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`button.ckpt[data-ckpt="2"]`)),
		poll(`document.getElementById("title").textContent.includes("Checkpoint 2")`),
		chromedp.Click(chromedp.CSS(`#rollback`)),
		poll(`document.getElementById("status").textContent.includes("rolled back to 2")`),
		chromedp.WaitVisible(chromedp.CSS(`button.ckpt.head[data-ckpt="2"]`)),
	)
	status, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#status`)))
	if err != nil {
		t.Fatalf("browser: roll back through the page: %v (status %q)", err, status)
	}
	if !strings.Contains(files, "modified /w/f") || !strings.Contains(files, "added /w/g") {
		t.Errorf("diff of checkpoint 3 in the page: %q", files)
	}
	if head := d.checkpointHead(id); head != "2" {
		t.Fatalf("after the page's rollback the head is %s, want 2 (status %q)", head, status)
	}
	if got := d.cli("exec", id, "--", "cat", "/w/f"); got != "one\n" {
		t.Fatalf("file after the page's rollback: %q", got)
	}
}
