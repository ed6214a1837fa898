package e2b

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFilesystemStatMakeDirMove checks the entries Stat, MakeDir and Move answer with, and that
// ListDir and CreateWatcher refuse a path that is not a directory.
func TestFilesystemStatMakeDirMove(t *testing.T) {
	f := newFake(t)
	srv := newTestGateway(t, f, Options{})
	c := create(t, srv, keyA)
	hdr := []string{"E2b-Sandbox-Id", c.SandboxID, "X-Access-Token", c.EnvdAccessToken}
	rpc := func(method string, body any) (int, entryInfo) {
		t.Helper()
		status, raw := call(t, "POST", srv.URL+"/filesystem.Filesystem/"+method, "", body, hdr...)
		var out entryResponse
		if status == http.StatusOK {
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("%s: %v: %s", method, err, raw)
			}
		}
		return status, out.Entry
	}
	if status, e := rpc("MakeDir", map[string]any{"path": "/d"}); status != http.StatusOK || e.Path != "/d" || e.Name != "d" || e.Type != "FILE_TYPE_DIRECTORY" {
		t.Fatalf("MakeDir = %d %+v", status, e)
	}
	if status, _ := rpc("MakeDir", map[string]any{"path": "/d"}); status == http.StatusOK {
		t.Errorf("MakeDir of an existing directory succeeded")
	}
	if status, e := rpc("Move", map[string]any{"source": "/d", "destination": "/e"}); status != http.StatusOK || e.Path != "/e" || e.Name != "e" || e.Type != "FILE_TYPE_DIRECTORY" {
		t.Fatalf("Move = %d %+v", status, e)
	}
	if status, e := rpc("Stat", map[string]any{"path": "/e"}); status != http.StatusOK || e.Path != "/e" || e.Type != "FILE_TYPE_DIRECTORY" {
		t.Errorf("Stat = %d %+v", status, e)
	}
	if status, _ := rpc("Stat", map[string]any{"path": "/d"}); status == http.StatusOK {
		t.Errorf("Stat of the moved-away path succeeded")
	}
	if err := os.WriteFile(filepath.Join(f.root(c.SandboxID), "file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"ListDir", "CreateWatcher"} {
		status, raw := call(t, "POST", srv.URL+"/filesystem.Filesystem/"+m, "", map[string]any{"path": "/file"}, hdr...)
		if status != http.StatusBadRequest || !strings.Contains(string(raw), "/file is not a directory") {
			t.Errorf("%s of a file = %d %s, want 400 \"/file is not a directory\"", m, status, raw)
		}
	}
}
