package e2b

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"

	"github.com/containerd/errdefs"
)

// maxUpload bounds one uploaded file.
const maxUpload = 1 << 30

// fileRoutes registers envd's plain HTTP routes.
func (g *Gateway) fileRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if _, err := g.envdSandbox(r); err != nil {
			// The SDK reads 502 as "the sandbox is not running".
			writeEnvdError(w, http.StatusBadGateway, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /files", g.download)
	mux.HandleFunc("POST /files", g.upload)
}

// writeEnvdError answers an envd HTTP route with {code, message}.
func writeEnvdError(w http.ResponseWriter, status int, err error) {
	if status == 0 {
		_, status = connectCode(err)
		if status == 499 {
			status = http.StatusRequestTimeout
		}
	}
	writeAPI(w, status, apiError{Code: status, Message: err.Error()})
}

// download answers GET /files?path=P with the file's bytes.
func (g *Gateway) download(w http.ResponseWriter, r *http.Request) {
	sb, err := g.envdSandbox(r)
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	rel, abs, err := sb.resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	root, err := g.b.SandboxRoot(r.Context(), sb.id)
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	defer root.Close()
	f, st, err := root.OpenFile(rel)
	if err != nil {
		if errdefs.IsNotFound(err) {
			err = fmt.Errorf("file %s not found: %w", abs, err)
		}
		writeEnvdError(w, 0, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(abs)}))
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size, 10))
	_, _ = io.CopyN(w, f, st.Size)
}

// upload answers POST /files: a multipart form of "file" parts (each named by the path query
// or its own file name) or one octet-stream body for the path query.
func (g *Gateway) upload(w http.ResponseWriter, r *http.Request) {
	sb, err := g.envdSandbox(r)
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	root, err := g.b.SandboxRoot(r.Context(), sb.id)
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	defer root.Close()
	query := r.URL.Query().Get("path")
	var out []fileEntry
	write := func(p string, body io.Reader) error {
		rel, abs, err := sb.resolve(p)
		if err != nil {
			return err
		}
		if _, err := root.WriteFile(rel, &capReader{r: body, left: maxUpload}, 0o644); err != nil {
			return err
		}
		out = append(out, fileEntry{Name: path.Base(abs), Type: "file", Path: abs})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case r.Header.Get("Content-Encoding") != "" && r.Header.Get("Content-Encoding") != "identity":
		err = fmt.Errorf("Content-Encoding %q is not supported: %w", r.Header.Get("Content-Encoding"), errdefs.ErrInvalidArgument)
	case mt == "multipart/form-data":
		err = writeParts(multipart.NewReader(r.Body, params["boundary"]), query, write)
	default:
		err = write(query, r.Body)
	}
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	writeAPI(w, http.StatusOK, out)
}

// writeParts writes every "file" part of a form.
func writeParts(mr *multipart.Reader, query string, write func(string, io.Reader) error) error {
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read multipart body: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if part.FormName() != "file" {
			continue
		}
		p := query
		if p == "" { // the file name carries the path (multipart.Part.FileName keeps only its base)
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = params["filename"]
		}
		if err := write(p, part); err != nil {
			return err
		}
	}
}

// capReader fails a read past left bytes (a silent cut would store a truncated file).
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var one [1]byte
		if n, _ := c.r.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("upload is over %d bytes: %w", int64(maxUpload), errdefs.ErrInvalidArgument)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}
