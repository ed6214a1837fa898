// Package main is benchreport: it turns `go test -bench` output (stdin) into the markdown tables of
// docs/benchmarks.md: one row per benchmark with each custom metric (p50/p99 in ms, ratios
// against the baseline measured in the same run), then the targets the figures are held to,
// met or missed. The header text is read from a file. Timing targets live here, not in tests:
// on a shared, noisy machine a test with a stopwatch fails for the neighbours' load.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type result struct {
	pkg, name string
	metrics   map[string]string
}

func main() {
	header := flag.String("header", "", "markdown file printed before the tables")
	flag.Parse()
	results, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	if *header != "" {
		data, err := os.ReadFile(*header)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
		os.Stdout.Write(data)
	}
	write(os.Stdout, results)
	writeTargets(os.Stdout, results)
}

func parse(r io.Reader) ([]result, error) {
	var out []result
	pkg, pending := "", ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(p, "github.com/deltabox/deltabox/")
			continue
		}
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], "Benchmark") {
			pending = strings.TrimPrefix(f[0], "Benchmark")
			f = f[1:]
		}
		// A result is "N  V ns/op  V unit ...", on the name's line or, when something printed
		// in between, on a later one.
		if pending == "" || len(f) < 3 || !isCount(f[0]) || f[2] != "ns/op" {
			continue
		}
		res := result{pkg: pkg, name: pending, metrics: map[string]string{}}
		for i := 1; i+1 < len(f); i += 2 {
			res.metrics[f[i+1]] = f[i]
		}
		out = append(out, res)
		pending = ""
	}
	return out, sc.Err()
}

func write(w io.Writer, results []result) {
	fmt.Fprintln(w, "| package | benchmark | metric | value |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, r := range results {
		keys := make([]string, 0, len(r.metrics))
		for k := range r.metrics {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", r.pkg, r.name, k, r.metrics[k])
		}
	}
}

func isCount(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}
