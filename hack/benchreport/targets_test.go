package main

import (
	"strings"
	"testing"
)

const sample = `pkg: github.com/deltabox/deltabox/integration
BenchmarkRefill-2   	       5	 812345678 ns/op	      2100 refill10-p50-ms	      3400 refill10-p99-ms
BenchmarkExecVsCtrExec-2   	     400	   1234 ns/op	      1.9 exec-api-p50-ms	      31.2 ctr-exec/exec-x
`

func TestTargets(t *testing.T) {
	results, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"refill10-p99-ms":  "MISSED", // 3.4 s is over the 3 s of the refill target
		"exec-api-p50-ms":  "met",
		"ctr-exec/exec-x":  "met",
		"lease-api-p50-ms": "not measured",
	}
	for _, tg := range targets {
		w, ok := want[tg.metric]
		if !ok {
			continue
		}
		if _, got := tg.verdict(results); got != w {
			t.Errorf("%s: %s, want %s", tg.metric, got, w)
		}
	}
	var out strings.Builder
	writeTargets(&out, results)
	if !strings.Contains(out.String(), "| pool back to 10 ready within 3 s after 10 leases | Refill | refill10-p99-ms | <= 3000 | 3400 | MISSED |") {
		t.Errorf("targets table:\n%s", out.String())
	}
}
