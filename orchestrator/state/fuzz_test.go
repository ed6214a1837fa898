package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzApplyInverse applies one op to a document. If the op fails, the document must be
// unchanged; if it applies, the tracked size must match the encoding, and its inverse (after
// a round trip through JSON, as through the log) must restore the original exactly.
// The seed corpus is every (document, op) pair of the conformance tables, so plain `go test`
// runs them; `go test -fuzz FuzzApplyInverse` explores further.
func FuzzApplyInverse(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, docRaw, opRaw []byte) {
		root, err := decodeValue(docRaw)
		if err != nil {
			return
		}
		orig, err := encode(root)
		if err != nil {
			t.Fatal(err)
		}
		var o Op
		if json.Unmarshal(opRaw, &o) != nil {
			return
		}
		c, err := compileOp(o, 0)
		if err != nil {
			return
		}
		d, err := newDocument(root)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := d.applyOp(c)
		if err != nil {
			requireDoc(t, d, orig, "after a failed op")
			return
		}
		requireDoc(t, d, nil, "after the op")
		var back []Op
		if err := json.Unmarshal([]byte(mustJSON(t, inv)), &back); err != nil {
			t.Fatalf("inverse %s does not decode: %v", mustJSON(t, inv), err)
		}
		if err := d.applyList(back); err != nil {
			t.Fatalf("inverse %s of %s on %s: %v", mustJSON(t, inv), opRaw, orig, err)
		}
		requireDoc(t, d, orig, "after the inverse of "+string(opRaw)+" ("+mustJSON(t, inv)+")")
	})
}

// requireDoc checks d's tracked size and, if want is not nil, its canonical encoding.
func requireDoc(t *testing.T, d *document, want []byte, when string) {
	t.Helper()
	got, err := encode(d.root)
	if err != nil {
		t.Fatal(err)
	}
	if want != nil && string(got) != string(want) {
		t.Fatalf("%s: document = %s, want %s", when, got, want)
	}
	if d.size != int64(len(got)) {
		t.Fatalf("%s: tracked size %d, encoding is %d bytes", when, d.size, len(got))
	}
}

// fuzzSeeds returns (document, op) pairs from the conformance tables.
func fuzzSeeds(f *testing.F) [][2][]byte {
	files, _ := filepath.Glob("testdata/*.json")
	if len(files) == 0 {
		f.Fatal("no seed tables in testdata")
	}
	var seeds [][2][]byte
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var cases []patchCase
		if err := json.Unmarshal(data, &cases); err != nil {
			f.Fatal(err)
		}
		for _, c := range cases {
			var ops []json.RawMessage
			if json.Unmarshal(c.patch(), &ops) != nil {
				ops = []json.RawMessage{c.patch()}
			}
			for _, op := range ops {
				seeds = append(seeds, [2][]byte{c.doc(), op})
			}
		}
	}
	return seeds
}
