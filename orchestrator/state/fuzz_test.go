package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fuzz document's limits, small so that the fuzzer reaches them.
const (
	fuzzMaxDepth = 16
	fuzzMaxSize  = 4096
)

// FuzzApplyInverse applies one op to a document held to a depth and a size limit. If the op
// fails, the document must be unchanged; if it applies, the tracked size must match the
// encoding, the document must be within both limits (unless it started past them and the op
// did not grow it), and its inverse (after a round trip through JSON, as through the log)
// must restore the original exactly.
// The seed corpus is every (document, op) pair of the conformance tables, so plain `go test`
// runs them; `go test -fuzz FuzzApplyInverse` explores further.
func FuzzApplyInverse(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed[0], seed[1])
	}
	// Ops that deepen or grow the document towards the fuzz limits.
	f.Add([]byte(`{"a":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{}}}}}}}}}`), []byte(`{"op":"copy","from":"/a","path":"/a/x/x/x/x/x/x/x/x"}`))
	f.Add([]byte(`{"a":{"x":{}}}`), []byte(`{"op":"move","from":"/a","path":"/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q"}`))
	f.Add([]byte(`[[]]`), []byte(`{"op":"append","path":"/0","value":[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]}`))
	f.Add([]byte(`{"s":"`+strings.Repeat("x", 3000)+`"}`), []byte(`{"op":"copy","from":"/s","path":"/t"}`))
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
		d.maxDepth, d.maxSize = fuzzMaxDepth, fuzzMaxSize
		wasDeep := deeperThan(root, fuzzMaxDepth)
		inv, err := d.applyChecked(c)
		if err != nil {
			requireDoc(t, d, orig, "after a failed op")
			return
		}
		requireDoc(t, d, nil, "after the op")
		if !wasDeep && deeperThan(d.root, fuzzMaxDepth) {
			t.Fatalf("%s made the document deeper than %d levels", opRaw, fuzzMaxDepth)
		}
		if d.size > fuzzMaxSize && d.size > int64(len(orig)) {
			t.Fatalf("%s grew the document to %d bytes, past the limit of %d", opRaw, d.size, fuzzMaxSize)
		}
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
