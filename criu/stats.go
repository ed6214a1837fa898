package criu

import (
	"fmt"
	"os"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
)

// DumpStats is CRIU's own account of a dump (its stats-dump file). Freezing is the time to
// stop the tasks, Frozen the whole time they stayed stopped, MemDump the time to drain their
// memory into pipes and MemWrite the time to write those pages to the images.
type DumpStats struct {
	Freezing     time.Duration
	Frozen       time.Duration
	MemDump      time.Duration
	MemWrite     time.Duration
	PagesScanned uint64
	PagesWritten uint64
}

// ReadDumpStats parses stats-dump in an images directory.
func ReadDumpStats(dir string) (DumpStats, error) {
	f, err := os.Open(dir)
	if err != nil {
		return DumpStats{}, fmt.Errorf("open criu images dir: %w", err)
	}
	defer f.Close()
	st, err := stats.CriuGetDumpStats(f)
	if err != nil {
		return DumpStats{}, fmt.Errorf("read %s stats: %w", dir, err)
	}
	us := func(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
	return DumpStats{
		Freezing:     us(st.GetFreezingTime()),
		Frozen:       us(st.GetFrozenTime()),
		MemDump:      us(st.GetMemdumpTime()),
		MemWrite:     us(st.GetMemwriteTime()),
		PagesScanned: st.GetPagesScanned(),
		PagesWritten: st.GetPagesWritten(),
	}, nil
}
