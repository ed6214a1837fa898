package pool

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
)

// Usage is what a leased sandbox's cgroup has used.
type Usage struct {
	CPUNanos    uint64 // CPU time of all its processes since the cgroup was made
	MemoryBytes uint64 // memory in use now (page cache included)
}

// Usage reads a leased sandbox's CPU time and memory from its cgroup files.
func (m *Manager) Usage(id string) (Usage, error) {
	sb, err := m.Get(id)
	if err != nil {
		return Usage{}, err
	}
	if sb.Layout.Cgroup == "" {
		return Usage{}, fmt.Errorf("sandbox %q has no cgroup path", id)
	}
	if cgroups.Mode() == cgroups.Unified {
		return usageV2(filepath.Join("/sys/fs/cgroup", sb.Layout.Cgroup))
	}
	return usageV1(sb.Layout.Cgroup)
}

func usageV1(path string) (Usage, error) {
	var u Usage
	var err error
	if u.CPUNanos, err = readUint(filepath.Join("/sys/fs/cgroup/cpuacct", path, "cpuacct.usage")); err != nil {
		return u, err
	}
	u.MemoryBytes, err = readUint(filepath.Join("/sys/fs/cgroup/memory", path, "memory.usage_in_bytes"))
	return u, err
}

func usageV2(dir string) (Usage, error) {
	var u Usage
	var err error
	if u.MemoryBytes, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
		return u, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return u, fmt.Errorf("read cgroup cpu.stat: %w", err)
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if k, v, ok := strings.Cut(string(line), " "); ok && k == "usage_usec" {
			us, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return u, fmt.Errorf("cgroup cpu.stat usage_usec %q: %w", v, err)
			}
			u.CPUNanos = us * 1000
		}
	}
	return u, nil
}

func readUint(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read cgroup file: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup file %s: %w", path, err)
	}
	return v, nil
}
