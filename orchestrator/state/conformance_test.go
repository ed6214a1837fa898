package state

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// patchCase is one row of testdata/*.json, in the style of json-patch-tests: a document, a
// patch, and either the expected document or the expected error class. The *_raw variants
// hold JSON text verbatim (for numbers a JSON library would round, or duplicate members).
type patchCase struct {
	Comment     string          `json:"comment"`
	Doc         json.RawMessage `json:"doc"`
	DocRaw      string          `json:"doc_raw"`
	Patch       json.RawMessage `json:"patch"`
	PatchRaw    string          `json:"patch_raw"`
	Expected    json.RawMessage `json:"expected"`
	ExpectedRaw string          `json:"expected_raw"`
	Error       string          `json:"error"`
}

func (c patchCase) doc() []byte      { return pick(c.DocRaw, c.Doc) }
func (c patchCase) patch() []byte    { return pick(c.PatchRaw, c.Patch) }
func (c patchCase) expected() []byte { return pick(c.ExpectedRaw, c.Expected) }

func pick(raw string, msg json.RawMessage) []byte {
	if raw != "" {
		return []byte(raw)
	}
	return msg
}

func loadCases(t *testing.T) []patchCase {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) < 2 {
		t.Fatalf("want the case tables in testdata/*.json, got %v (%v)", files, err)
	}
	var all []patchCase
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cs []patchCase
		if err := json.Unmarshal(data, &cs); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		all = append(all, cs...)
	}
	return all
}

// TestConformance runs every case against the op engine, checking the result (or that a
// failing patch left the document unchanged), the tracked size, and that the logged inverses
// restore the original document.
func TestConformance(t *testing.T) {
	for _, c := range loadCases(t) {
		t.Run(c.Comment, func(t *testing.T) { runEngineCase(t, c) })
	}
}

func runEngineCase(t *testing.T, c patchCase) {
	orig := canon(t, c.doc())
	ops, err := ParseOps(c.patch())
	var invs [][]Op
	var d *document
	if err == nil {
		root, _ := decodeValue(c.doc())
		d, _ = newDocument(root)
		var compiled []compiledOp
		if compiled, err = compileAll(ops); err == nil {
			invs, err = d.applyOps(compiled, ops)
		}
	}
	if c.Error != "" {
		if got := classOf(err); got != c.Error {
			t.Fatalf("error = %v (class %q), want class %q", err, got, c.Error)
		}
		if d != nil {
			checkDoc(t, d, orig, "after a failed patch")
		}
		return
	}
	if err != nil {
		t.Fatalf("patch failed: %v", err)
	}
	checkDoc(t, d, canon(t, c.expected()), "after the patch")
	if err := d.undo(invs); err != nil {
		t.Fatalf("undo: %v", err)
	}
	checkDoc(t, d, orig, "after applying the inverses")
}

func compileAll(ops []Op) ([]compiledOp, error) {
	out := make([]compiledOp, len(ops))
	for i, o := range ops {
		c, err := compileOp(o, 0)
		if err != nil {
			return nil, opError(i, o, err, errdefs.ErrInvalidArgument)
		}
		out[i] = c
	}
	return out, nil
}

// checkDoc compares d with want (canonical) and checks d's tracked size.
func checkDoc(t *testing.T, d *document, want, when string) {
	t.Helper()
	got, err := encode(d.root)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s: document = %s, want %s", when, got, want)
	}
	if d.size != int64(len(got)) {
		t.Fatalf("%s: tracked size %d, encoding is %d bytes", when, d.size, len(got))
	}
}

// TestConformanceThroughStore runs the same cases through Store.Patch, checking the error
// classes the API will see and that a failed patch changes neither document nor seq.
func TestConformanceThroughStore(t *testing.T) {
	s := openStore(t, t.TempDir())
	defer s.Close()
	ctx := context.Background()
	for _, c := range loadCases(t) {
		t.Run(c.Comment, func(t *testing.T) {
			doc := json.RawMessage(c.doc())
			if _, err := s.Patch(ctx, []Op{{Op: OpReplace, Path: "", Value: doc}}, PatchOptions{}); err != nil {
				t.Fatalf("load document: %v", err)
			}
			seq := s.Seq()
			ops, err := ParseOps(c.patch())
			if err == nil {
				_, err = s.Patch(ctx, ops, PatchOptions{Checkpoint: "ck"})
			}
			if got := classOf(err); got != c.Error {
				t.Fatalf("error = %v (class %q), want class %q", err, got, c.Error)
			}
			want := c.expected()
			if c.Error != "" {
				want = c.doc()
				if s.Seq() != seq {
					t.Fatalf("seq moved from %d to %d on a failed patch", seq, s.Seq())
				}
			}
			wantDoc(t, s, string(want))
		})
	}
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}
