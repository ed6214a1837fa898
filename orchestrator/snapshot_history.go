package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/orchestrator/api"
)

// inheritedFile holds, in a restored sandbox's session dir, the checkpoints its snapshot
// carried from the source sandbox (listed before its own; not rollback targets: their files
// and processes are not on this node).
const inheritedFile = "inherited.json"

// sessionSeed is how a restored sandbox's session starts: its agent state, the ID and message
// of its first checkpoint (the snapshot's checkpoint, so IDs continue where the source's
// history stops) and the inherited history.
type sessionSeed struct {
	state   json.RawMessage
	first   string // ID of the first own checkpoint; "" = "1"
	message string
	history []api.Checkpoint
}

// seedFor is the session seed of a sandbox restored from a fetched snapshot.
func seedFor(f *fetched, message string) *sessionSeed {
	var hist []api.Checkpoint
	for _, c := range f.cfg.History {
		if c.ID != f.cfg.Checkpoint {
			hist = append(hist, c)
		}
	}
	return &sessionSeed{state: f.state, first: f.cfg.Checkpoint, message: message, history: hist}
}

func (s *sessionSeed) doc() json.RawMessage {
	if s == nil {
		return nil
	}
	return s.state
}

// applySeed records the inherited history and numbers the first checkpoint; called on a
// fresh session only, before its first checkpoint.
func (s *session) applySeed(seed *sessionSeed) error {
	if seed == nil {
		return nil
	}
	if n := ckptNum(seed.first); n > 0 {
		s.meta.Next = n
	}
	if len(seed.history) == 0 {
		return nil
	}
	data, err := json.Marshal(seed.history)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.dir, inheritedFile), data, 0o600); err != nil {
		return fmt.Errorf("record inherited checkpoints: %w", err)
	}
	s.inherited = seed.history
	return nil
}

// loadInherited reads the inherited history of a (re)opened session, if any.
func (s *session) loadInherited() error {
	data, err := os.ReadFile(filepath.Join(s.dir, inheritedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &s.inherited); err != nil {
		return fmt.Errorf("%s: %v: %w", inheritedFile, err, errdefs.ErrDataLoss)
	}
	return nil
}

// snapshotHistory is the source's checkpoints up to and including ck, as the snapshot
// carries them (caller holds s.mu).
func (s *session) snapshotHistory(ck string) []api.Checkpoint {
	out := append([]api.Checkpoint(nil), s.inherited...)
	path := s.ancestors(ck) // its branch, from the first checkpoint down
	for i := len(path) - 1; i >= 0; i-- {
		out = append(out, s.view(s.ckpts[s.find(path[i])]))
	}
	return out
}
