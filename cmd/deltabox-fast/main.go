// Package main is bin/deltabox, the CLI's fast front: a small program that runs the command
// lines an agent runs at every step, `deltabox lease --pool NAME`, `deltabox exec ID CMD
// [ARGS...]`, `deltabox checkpoint create ID`, `deltabox rollback ID [--to CKPT]` and
// `deltabox release ID...` (plus `--version`), in text or -o json, itself, and replaces
// itself (execve) with bin/deltabox-cli, the urfave/cli client build of cmd/deltabox
// installed next to it, for every other command line, unchanged.
//
// Why a second program (issue 19: lease and `exec ID true` within 10 ms): this VM class is a
// PVM guest where every page a process touches for the first time costs 13-35 us, so a
// call's start is its page faults. Go runs the package initialisers of everything linked,
// whether the call uses it or not: urfave/cli with text/template and regexp (~80-100 faults),
// net/http with crypto/tls (~75), encoding/json (~35), so no fast path inside the urfave/cli
// build can start in less than ~15 ms here (docs/benchmarks.md, "the fast front"). This
// program links none of them: it speaks HTTP/1.1 to the daemon's unix socket by hand
// (wire.go) and reads the few JSON shapes it needs with a small parser (json.go).
//
// What it handles it must print exactly as deltabox-cli does (stdout, stderr, exit code):
// parse.go accepts only command lines whose meaning it knows in full, with the global flags
// --address/-a (a unix socket; DELTABOX_ADDRESS) and -o text|wide|json, exec's
// --output-cap, checkpoint create's --level, -m/--message, --name, --pin, --async,
// --processes and rollback's --to, --force, --replay (bool flags bare); anything else
// (another flag, -o yaml, --format, a tcp:// address, -i/-t/-d, --timeout, help, completion,
// a usage error) goes to deltabox-cli. A -o json result is the daemon's body re-encoded
// (json.go, reencode: TestReencodeMatchesEncodingJSON holds it to encoding/json's decode and
// indented encode). TestFastMatchesCLI and TestFastMatchesCLISteps (integration) run both on
// the same command lines against a real daemon.
//
// It does not link internal/oneproc as deltabox-cli does: it allocates so little that
// setting GOMAXPROCS from an initialiser costs more pages than it saves (231 faults per lease
// with it, 216 without, against 182 for a static hello world).
//
// What runs where. Even so, a Go program cannot start in less than the Go runtime's ~180
// faults (~8 ms here; a static C program: ~25), so the lines an agent runs at every step,
// `lease --pool NAME`, `exec ID [--] CMD [ARGS...]`, `checkpoint create ID` and `rollback ID`
// with their flags above, and `release ID` for one ID (text output, a leading --address/-a
// at most among the globals, a unix socket, arguments in ASCII), run in C, as runc's nsenter
// runs before the runtime: cfront.c is an ELF constructor that libc calls before main, which sends
// the request, prints the result and _exit()s (~37 faults). For every other command line it
// returns at once having sent nothing, and this Go front runs as described above. Once it has
// sent a request it never lets it be sent again: on anything it does not fully know (a status
// other than 200, an odd header, JSON shape or event, an error notice, a read or write error)
// it leaves the connection and the bytes it read and did not use in C globals, and this
// program's request (run.go) reads on from there (handover.go) with its own code, which
// prints what it would have printed for a request of its own. So the build needs cgo (the
// Makefile links it statically with glibc); built without cgo (nocgo.go), every line runs in
// Go, as TestCFront's reference does. The C front's trace (DELTABOX_FRONT_TRACE, a file) is
// for the tests only.
package main

import (
	"os"
	"path/filepath"
	"syscall"
)

// cliBinary is the urfave/cli build every other command line is handed to.
const cliBinary = "deltabox-cli"

func main() {
	sentByC = cFront()
	c, ok := parse(os.Args[1:], syscall.Getenv)
	if !ok && sentByC != nil { // cannot be (C sends only lines parse runs): never send it twice
		os.Stderr.WriteString("deltabox: internal error: the C front sent a request for a command line the Go front does not run\n")
		os.Exit(1)
	}
	if !ok {
		os.Exit(handOver(os.Args))
	}
	os.Exit(c.run(os.Stdout, os.Stderr))
}

// handOver replaces this process with deltabox-cli next to it and the same argv (argv[0]
// included); it returns only when that fails, with the exit code after saying why.
func handOver(argv []string) int {
	self, err := os.Executable()
	if err == nil {
		full := filepath.Join(filepath.Dir(self), cliBinary)
		if _, err = os.Stat(full); err == nil {
			err = syscall.Exec(full, argv, os.Environ())
		}
		os.Stderr.WriteString("deltabox: this command line is run by " + cliBinary + ", which should be installed next to " +
			self + " (make build builds both): " + err.Error() + "\n")
		return 1
	}
	os.Stderr.WriteString("deltabox: find this binary to start " + cliBinary + " next to it: " + err.Error() + "\n")
	return 1
}
