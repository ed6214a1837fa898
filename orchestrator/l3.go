package orchestrator

import (
	"path/filepath"

	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/deltabox/deltabox/criu"
)

// criuSpec writes a sandbox's CRIU configuration file (tcp-established for in-place restores,
// file-locks so that processes holding locks can be dumped) and names it on the spec: the
// containerd shim forwards no CRIU options itself.
func (o *Orchestrator) criuSpec(cid, dir string) ([]oci.SpecOpts, error) {
	path := filepath.Join(dir, "criu.conf")
	if err := criu.WriteConfig(path, criu.Options{TCPEstablished: true, FileLocks: true}); err != nil {
		return nil, err
	}
	return []oci.SpecOpts{criu.WithConfig(path)}, nil
}
