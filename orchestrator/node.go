package orchestrator

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
)

// nodeID returns this node's ID, stored in <root>/node-id and created on first start. It
// labels the node's containers, so daemons sharing a containerd namespace never touch each
// other's sandboxes.
func nodeID(root string) (string, error) {
	path := filepath.Join(root, "node-id")
	data, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(data)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read node id: %w", err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := "node-" + hex.EncodeToString(b)
	if err := atomicfile.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write node id: %w", err)
	}
	return id, nil
}

// installInit copies the sandbox init binary into dir (unless it is already there with the
// same content) and returns the installed path. Replacing it by rename leaves the copies
// bind-mounted into running sandboxes untouched.
func installInit(src, dir string) (string, error) {
	if src == "" {
		return "", fmt.Errorf("no sandbox init binary configured (build it with make build): %w", errdefs.ErrInvalidArgument)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read sandbox init binary: %w", err)
	}
	dst := filepath.Join(dir, "deltabox-init")
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, data) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := atomicfile.WriteFile(dst, data, 0o755); err != nil {
		return "", fmt.Errorf("install sandbox init: %w", err)
	}
	return dst, nil
}
