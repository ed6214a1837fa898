package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// timeTravelRoutes registers the host API's routes for looking at a sandbox's tree without
// moving it (docs/time-travel.md).
func (o *Orchestrator) timeTravelRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/sandboxes/{id}/log", handle(func(r *http.Request) (any, error) {
		all, _ := strconv.ParseBool(r.URL.Query().Get("all"))
		return o.Storyboard(r.Context(), r.PathValue("id"), all)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/checkpoints/{ckpt}/file", o.showFile)
	mux.HandleFunc("POST /v1/sandboxes/{id}/checkpoints/{ckpt}/pin", handle(func(r *http.Request) (any, error) {
		var req api.PinRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return o.Pin(r.Context(), r.PathValue("id"), r.PathValue("ckpt"), req.Pinned)
	}))
}

// Storyboard returns a sandbox's history: the checkpoints of its current branch (all: of the
// whole tree, in ID order), each with the state ops that led to it, the commands run after it
// and the effects recorded after it.
func (o *Orchestrator) Storyboard(ctx context.Context, id string, all bool) (api.Storyboard, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.Storyboard{}, err
	}
	steps, err := s.steps.read()
	if err != nil {
		return api.Storyboard{}, err
	}
	effects, err := o.effects.List(ctx, id, 0, 0)
	if err != nil {
		return api.Storyboard{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	sb := api.Storyboard{Sandbox: id, Head: s.head, Entries: []api.StoryEntry{}}
	var ids []string
	if all {
		for _, c := range s.ckpts {
			ids = append(ids, c.ID)
		}
	} else {
		anc := s.ancestors(s.head)
		for i := len(anc) - 1; i >= 0; i-- {
			ids = append(ids, anc[i])
		}
	}
	for _, cid := range ids {
		c := s.ckpts[s.find(cid)]
		e := api.StoryEntry{Checkpoint: s.view(c), StateOps: []api.StateEntry{}, Steps: []api.Step{}, Effects: []api.Effect{}}
		for _, op := range c.StateOps {
			e.StateOps = append(e.StateOps, stateEntry(op))
		}
		for _, st := range steps {
			if st.Checkpoint == cid {
				e.Steps = append(e.Steps, st)
			}
		}
		for _, ef := range effects {
			if ef.Checkpoint == cid {
				e.Effects = append(e.Effects, ef)
			}
		}
		sb.Entries = append(sb.Entries, e)
	}
	return sb, nil
}

// showFile serves GET .../checkpoints/{ckpt}/file?path=P: the file's content as of the
// checkpoint (raw bytes; its kind, mode and size in X-Deltabox-File as JSON).
func (o *Orchestrator) showFile(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var buf bytes.Buffer
	info, err := o.ShowFile(ctx, r.PathValue("id"), r.PathValue("ckpt"), r.URL.Query().Get("path"), &buf)
	if err != nil {
		writeError(ctx, w, err)
		return
	}
	meta, _ := json.Marshal(info)
	w.Header().Set("X-Deltabox-File", string(meta))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	_, _ = w.Write(buf.Bytes())
}

// maxShowBytes bounds a file shown from a checkpoint.
const maxShowBytes = 64 << 20

// ShowFile writes the content of path p as of checkpoint ckpt (a reference) to w.
func (o *Orchestrator) ShowFile(ctx context.Context, id, ckpt, p string, w io.Writer) (api.FileInfo, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, err := s.resolve(ckpt)
	if err != nil {
		return api.FileInfo{}, err
	}
	lw := &limitWriter{w: w, left: maxShowBytes}
	fi, err := s.fs.ReadFile(ctx, s.ckpts[i].ID, p, lw)
	info := api.FileInfo{Path: fi.Path, Kind: string(fi.Kind), Mode: fi.Mode, Size: fi.Size, Target: fi.Target}
	if lw.over {
		err = fmt.Errorf("%s is %d bytes, more than the %d shown: %w", info.Path, info.Size, maxShowBytes, errdefs.ErrInvalidArgument)
	}
	return info, err
}

// limitWriter fails writes beyond left bytes.
type limitWriter struct {
	w    io.Writer
	left int64
	over bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		l.over = true
		return 0, io.ErrShortWrite
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}

// StateAt returns the agent state document (or the value at pointer) as of checkpoint ckpt,
// without moving the sandbox.
func (o *Orchestrator) StateAt(ctx context.Context, id, ckpt, pointer string) (json.RawMessage, error) {
	s, err := o.session(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, err := s.resolve(ckpt)
	if err != nil {
		return nil, err
	}
	return s.stateAt(i, pointer)
}
