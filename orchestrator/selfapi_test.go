package orchestrator

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// TestSelfRollbackNeverForces is issue 11.6: from inside a sandbox no body can make the
// rollback handler honour force past a commit, whatever a separate check would have made of
// it (a second value, trailing bytes, duplicate keys, a differently cased key).
func TestSelfRollbackNeverForces(t *testing.T) {
	bodies := []string{
		`{"to":"1","force":true}`,
		`{"to":"1","force":false} {"to":"1","force":true}`,
		`{"to":"1","force":true}x`,
		`{"to":"1","force":true}}`,
		`{"to":"1","force":false,"force":true}`,
		`{"to":"1","Force":true}`,
		`{"to":"1","FORCE":true}`,
		`{"to":"1","forcE":true} `,
	}
	for _, body := range bodies {
		r := newRig(t, 0)
		r.checkpoint()
		r.s.meta.CommitAfter = "2" // checkpoint 1 is before the commit
		code, e := serve(r.o.selfHandler("sb"), "/v1/self/rollback", body)
		if code == http.StatusOK || len(r.s.ckpts) != 2 {
			t.Fatalf("body %s: %d %+v, checkpoints %v: a forced rollback ran inside the sandbox", body, code, e, ids(r.s.ckpts))
		}
		if e.Code != api.CodeFailedPrecondition && e.Code != api.CodeInvalidArgument {
			t.Fatalf("body %s: error %+v, want failed_precondition or invalid_argument", body, e)
		}
	}
}

// TestHostDecodeRejectsTrailingData: the host API refuses a body with anything after its one
// JSON value, naming why; whitespace after it is fine.
func TestHostDecodeRejectsTrailingData(t *testing.T) {
	for body, want := range map[string]int{
		`{"to":"2"} {"to":"1"}`: http.StatusBadRequest,
		`{"to":"2"}x`:           http.StatusBadRequest,
		`{"to":"2"}]`:           http.StatusBadRequest,
		"{\"to\":\"2\"}\n\t ":   http.StatusOK,
	} {
		r := newRig(t, 0)
		r.checkpoint()
		mux := http.NewServeMux()
		r.o.checkpointRoutes(mux, "/v1/sandboxes/{id}", false)
		code, e := serve(mux, "/v1/sandboxes/sb/rollback", body)
		if code != want {
			t.Fatalf("body %q: %d %+v, want %d", body, code, e, want)
		}
		if want != http.StatusOK && !strings.Contains(e.Message, "data after the JSON value") {
			t.Fatalf("body %q: message %q does not say why", body, e.Message)
		}
	}
	req := strings.NewReader(`{"argv":["true"]} {"argv":["rm"]}` + "\n")
	if _, err := readExecRequest(bufio.NewReader(req)); err == nil || !strings.Contains(err.Error(), "data after the JSON value") {
		t.Fatalf("exec request with a second value: %v", err)
	}
}

func serve(h http.Handler, path, body string) (int, api.Error) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	var eb api.ErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &eb)
	return rec.Code, eb.Error
}
