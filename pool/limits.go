package pool

import (
	"fmt"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
)

// Limits bound one sandbox's resources. A zero field is unlimited.
type Limits struct {
	CPUs        float64 `json:"cpus"`         // CPU quota in cores (cgroup cpu.max)
	MemoryBytes int64   `json:"memory_bytes"` // memory and memory+swap limit (cgroup memory.max)
	Pids        int64   `json:"pids"`         // most processes and threads (cgroup pids.max)
	DiskBytes   int64   `json:"disk_bytes"`   // size of the sandbox's writable layer
}

// Smallest limits a sandbox can start with (the init and a shell need this much).
const (
	minMemoryBytes = 4 << 20
	minPids        = 8
	minDiskBytes   = 16 << 20
)

// Validate refuses negative limits and ones too small to start a sandbox; what names the
// owner (a pool, or the node defaults) in the error.
func (l Limits) Validate(what string) error {
	if l.CPUs < 0 || l.MemoryBytes < 0 || l.Pids < 0 || l.DiskBytes < 0 {
		return fmt.Errorf("%s: cpus, memory, pids and disk must not be negative: %w", what, errdefs.ErrInvalidArgument)
	}
	if l.MemoryBytes > 0 && l.MemoryBytes < minMemoryBytes {
		return fmt.Errorf("%s: memory %d bytes is below the 4 MiB minimum: %w", what, l.MemoryBytes, errdefs.ErrInvalidArgument)
	}
	if l.Pids > 0 && l.Pids < minPids {
		return fmt.Errorf("%s: pids %d is below the minimum of %d: %w", what, l.Pids, minPids, errdefs.ErrInvalidArgument)
	}
	if l.DiskBytes > 0 && l.DiskBytes < minDiskBytes {
		return fmt.Errorf("%s: disk %d bytes is below the 16 MiB minimum: %w", what, l.DiskBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Over returns l with its zero fields taken from defaults.
func (l Limits) Over(defaults Limits) Limits {
	if l.CPUs == 0 {
		l.CPUs = defaults.CPUs
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = defaults.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = defaults.Pids
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = defaults.DiskBytes
	}
	return l
}

// limits returns what the template asks for (zero: the node default).
func (t *Template) limits() Limits {
	return Limits{CPUs: t.CPUs, MemoryBytes: t.MemoryBytes, Pids: t.Pids, DiskBytes: t.DiskBytes}
}

// cgroupSpec sets the cgroup limits of l on a container's spec.
func (l Limits) cgroupSpec() []oci.SpecOpts {
	var opts []oci.SpecOpts
	if l.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(l.MemoryBytes)), oci.WithMemorySwap(l.MemoryBytes))
	}
	if l.CPUs > 0 {
		const period = 100000
		opts = append(opts, oci.WithCPUCFS(int64(l.CPUs*period), period))
	}
	if l.Pids > 0 {
		opts = append(opts, oci.WithPidsLimit(l.Pids))
	}
	return opts
}
