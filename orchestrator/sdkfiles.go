package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	pysdk "github.com/deltabox/deltabox/sdk/python"
)

const (
	// sdkPath is where every sandbox finds the SDKs, read-only: python/deltabox (the Python
	// package, on PYTHONPATH) and bin/deltabox (a client of the sandbox's own API).
	sdkPath = "/.deltabox/sdk"
	// sdkPythonPath is the directory added to PYTHONPATH.
	sdkPythonPath = sdkPath + "/python"
)

// sdkShim is bin/deltabox: `python3 -m deltabox` with the SDK on the path, for shells.
const sdkShim = `#!/bin/sh
# The sandbox's own DeltaBox API from a shell: checkpoints, rollback, state, diff (deltabox --help).
PYTHONPATH="` + sdkPythonPath + `${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m deltabox "$@"
`

// installSDK writes the embedded SDK files under root/sdk/<digest of the files> (once per
// version: a directory sandboxes mount is never changed in place) and returns that directory.
func installSDK(root string) (string, error) {
	files := map[string][]byte{"bin/deltabox": []byte(sdkShim)}
	err := fs.WalkDir(pysdk.Files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := pysdk.Files.ReadFile(p)
		files["python/"+p] = data
		return err
	})
	if err != nil {
		return "", fmt.Errorf("embedded SDK: %w", err)
	}
	h := sha256.New()
	for _, name := range sortedKeys(files) {
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(files[name]))
		h.Write(files[name])
	}
	dir := filepath.Join(root, "sdk", hex.EncodeToString(h.Sum(nil))[:16])
	if left, _ := filepath.Glob(filepath.Join(root, "sdk-tmp-*")); len(left) > 0 { // a start cut short
		for _, p := range left {
			os.RemoveAll(p)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(root), "sdk-tmp-")
	if err != nil {
		return "", fmt.Errorf("install SDK: %w", err)
	}
	defer os.RemoveAll(tmp)
	for name, data := range files {
		p := filepath.Join(tmp, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", fmt.Errorf("install SDK: %w", err)
		}
		mode := os.FileMode(0o444)
		if strings.HasPrefix(name, "bin/") {
			mode = 0o555
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			return "", fmt.Errorf("install SDK: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("install SDK: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("install SDK: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, os.ErrExist) {
		if _, serr := os.Stat(dir); serr != nil { // not a concurrent install of the same version
			return "", fmt.Errorf("install SDK: %w", err)
		}
	}
	return dir, nil
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sdkSpec mounts the SDK directory read-only at sdkPath and puts its Python package on
// PYTHONPATH, after any PYTHONPATH the pool sets.
func sdkSpec(dir string) []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithMounts([]specs.Mount{{Destination: sdkPath, Type: "bind", Source: dir, Options: []string{"rbind", "ro", "nosuid", "nodev"}}}),
		func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			if s.Process == nil {
				s.Process = &specs.Process{}
			}
			for i, kv := range s.Process.Env {
				if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
					if v == "" {
						s.Process.Env[i] = "PYTHONPATH=" + sdkPythonPath
					} else {
						s.Process.Env[i] = kv + ":" + sdkPythonPath
					}
					return nil
				}
			}
			s.Process.Env = append(s.Process.Env, "PYTHONPATH="+sdkPythonPath)
			return nil
		},
	}
}
