package pool

import (
	"os"
	"path/filepath"
	"testing"
)

func TestUsageV2ReadsCgroupFiles(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("123456\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "cpu.stat"), []byte("usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n"), 0o644)
	u, err := usageV2(dir)
	if err != nil || u.MemoryBytes != 123456 || u.CPUNanos != 2500000 {
		t.Errorf("usageV2 = %+v, %v", u, err)
	}
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("lots\n"), 0o644)
	if _, err := usageV2(dir); err == nil {
		t.Error("a malformed memory.current was accepted")
	}
}
