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
	return o.pools.CopyTo(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), r.Body)
}

// copyFrom answers with a tar stream of ?path= in the sandbox.
func (o *Orchestrator) copyFrom(w http.ResponseWriter, r *http.Request) {
	id, src := r.PathValue("id"), r.URL.Query().Get("path")
	if err := o.pools.StatPath(id, src); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	if err := o.pools.CopyFrom(r.Context(), id, src, w); err != nil {
		// The status line is gone; cut the stream so the client sees a broken tar.
		log.L(r.Context()).Error("copy from sandbox", "sandbox", id, "path", src, "error", err)
		panic(http.ErrAbortHandler)
	}
}
