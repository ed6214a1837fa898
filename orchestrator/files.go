package orchestrator

import (
	"net/http"

	"github.com/deltabox/deltabox/internal/log"
)

// copyTo extracts the request body (a tar stream) into the sandbox at ?path=.
func (o *Orchestrator) copyTo(r *http.Request) (any, error) {
	if _, err := o.session(r.Context(), r.PathValue("id")); err != nil {
		return nil, err
	}
	q := r.URL.Query()
	return o.pools.CopyTo(r.Context(), r.PathValue("id"), q.Get("path"), r.Body, q.Get("parents") == "true")
}

// copyFrom answers with a tar stream of ?path= in the sandbox.
func (o *Orchestrator) copyFrom(w http.ResponseWriter, r *http.Request) {
	id, src := r.PathValue("id"), r.URL.Query().Get("path")
	if err := o.pools.StatPath(id, src); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	sw := &sentWriter{w: w}
	if err := o.pools.CopyFrom(r.Context(), id, src, sw); err != nil {
		if !sw.sent { // nothing streamed yet (e.g. the file was swapped before it was read)
			w.Header().Del("Content-Type")
			writeError(r.Context(), w, err)
			return
		}
		// The status line is gone; cut the stream so the client sees a broken tar.
		log.L(r.Context()).Error("copy from sandbox", "sandbox", id, "path", src, "error", err)
		panic(http.ErrAbortHandler)
	}
}

// sentWriter records whether anything was written (after that, the status line is gone).
type sentWriter struct {
	w    http.ResponseWriter
	sent bool
}

func (s *sentWriter) Write(p []byte) (int, error) {
	s.sent = s.sent || len(p) > 0
	return s.w.Write(p)
}
