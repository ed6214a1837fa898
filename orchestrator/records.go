package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/atomicfile"
	"github.com/deltabox/deltabox/orchestrator/api"
	"github.com/deltabox/deltabox/orchestrator/state"
	"github.com/deltabox/deltabox/pool"
)

// ckptRecord is a checkpoint as stored on disk: the API view plus what rollback needs.
type ckptRecord struct {
	api.Checkpoint
	Procs  []pool.Proc `json:"procs"`            // the sandbox's processes at the cut
	Images string      `json:"images,omitempty"` // L3: directory of the CRIU images and state.json
	// StateOps are the agent state ops from the parent checkpoint to this one, with their
	// inverses: a rollback to another branch of the tree replays them (tree.go). TreeOps
	// says they were recorded (checkpoints of earlier versions lack them).
	StateOps []state.Entry `json:"state_ops,omitempty"`
	TreeOps  bool          `json:"tree_ops,omitempty"`
	// ProcCkpt is how a checkpoint taken with processes keeps them (processes.go). Named
	// "proc_checkpoint" in JSON: "processes" is the API summary of the embedded Checkpoint.
	ProcCkpt *procCheckpoint `json:"proc_checkpoint,omitempty"`
}

// headRecord is kept with a rollback in the layer store (RollbackRequest.Meta): the state
// sequence number at which the document is the head's, when that is not the head's own.
type headRecord struct {
	StateSeq uint64 `json:"state_seq"`
	// Rollback is the ID of the rollback intent whose rollback wrote the record: at start,
	// an intent still recorded with that ID was answered (its record was in place) and is
	// not redone (recover).
	Rollback string `json:"rollback,omitempty"`
}

// sessionMeta is the per-sandbox record that outlives individual checkpoints.
type sessionMeta struct {
	Next        int    `json:"next"`         // number of the next checkpoint (IDs are never reused)
	CommitAfter string `json:"commit_after"` // latest checkpoint at the last commit
	// Committing is the commit in progress: recorded (with CommitAfter moved) before the
	// first byte is sent, cleared once every effect up to its watermark was sent. Start-up
	// finishes a commit it finds.
	Committing *commitIntent `json:"committing,omitempty"`
	Pins       []string      `json:"pins,omitempty"` // pinned checkpoints: retention keeps them
}

// commitIntent is a commit that began: the effects with seq <= Upto are being sent.
type commitIntent struct {
	Checkpoint string `json:"checkpoint"` // the commit point
	Upto       uint64 `json:"upto"`       // effect watermark at the commit point
}

// records keeps a sandbox's meta.json, written atomically (temp file, fsync, rename,
// directory fsync). Checkpoint records live in the layer packs (overlay's Meta); the
// ckpt-ID.json files earlier versions wrote beside meta.json are still read and removed.
type records struct{ dir string }

func (r records) path(id string) string { return filepath.Join(r.dir, "ckpt-"+id+".json") }

func (r records) remove(id string) error {
	if err := os.Remove(r.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// list returns every checkpoint record, oldest first.
func (r records) list() ([]ckptRecord, error) {
	names, err := filepath.Glob(filepath.Join(r.dir, "ckpt-*.json"))
	if err != nil {
		return nil, err
	}
	out := make([]ckptRecord, 0, len(names))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		var rec ckptRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, fmt.Errorf("checkpoint record %s: %v: %w", n, err, errdefs.ErrDataLoss)
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return ckptNum(out[i].ID) < ckptNum(out[j].ID) })
	return out, nil
}

func (r records) readMeta() (sessionMeta, error) {
	m := sessionMeta{Next: 1}
	data, err := os.ReadFile(filepath.Join(r.dir, "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(data, &m)
}

func (r records) writeMeta(m sessionMeta) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(r.dir, "meta.json"), data, 0o600)
}

// ckptNum is the number of a checkpoint ID ("7" -> 7); IDs are decimal and increase.
func ckptNum(id string) int {
	n, err := strconv.Atoi(strings.TrimSpace(id))
	if err != nil {
		return -1
	}
	return n
}
