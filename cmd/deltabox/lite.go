package main

// The CLI is called once per agent step, so its start-up counts (issue 19: `deltabox exec ID
// true` within 10 ms). Go runs the package initialisers of everything linked in, and the
// daemon's dependencies (containerd's client and protobuf registrations, prometheus, the S3
// client, the proxy...) cost ~6 ms of init and page faults per call. `make build` therefore
// builds cmd/deltabox twice:
//
//   - bin/deltabox-cli with `-tags cli,urfave_cli_no_docs`: every client verb, and `daemon` as a
//     stub that replaces itself (execve) with bin/deltabox-daemon, found next to it
//     (urfave_cli_no_docs drops urfave/cli's man page renderer: `docs` has its own);
//   - bin/deltabox-daemon without tags: the same CLI with the daemon linked in.
//
// bin/deltabox itself is cmd/deltabox-fast, a front without urfave/cli and net/http that runs
// the per-step `lease` and `exec` and hands every other command line to bin/deltabox-cli.
//
// A plain `go build ./cmd/deltabox` gives the full binary, which works alone. Files that
// import the daemon's packages carry `//go:build !cli`; TestCLIBuildIsLight keeps it so.

// The usage lines of the verbs the cli build hands over to the full build (lite_cli.go).
const (
	daemonUsage = "run the DeltaBox node agent (as root)"
	policyUsage = "egress policies: print the default, check a file"
	configUsage = "work with the daemon's configuration file"
	runUsage    = "run a batch pipeline (YAML) over tasks (JSON lines), one sandbox per task"
)
