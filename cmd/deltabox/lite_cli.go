//go:build cli

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	_ "github.com/deltabox/deltabox/internal/oneproc" // one P: see its package doc
)

// daemonBinary is the full build the cli build hands some command lines over to.
const daemonBinary = "deltabox-daemon"

// rawArgs are the command line as given (before reorderArgs), for handing over to the full
// binary unchanged.
var rawArgs []string

func keepArgs(args []string) { rawArgs = args }

// daemonCommand in the cli build hands the whole command line over to deltabox-daemon.
func daemonCommand() *cli.Command { return handedOver("daemon", daemonUsage) }

// policyCommand in the cli build hands over too: checking a policy needs the proxy's parser.
func policyCommand() *cli.Command { return handedOver("policy", policyUsage) }

// configCommand hands over: the configuration's parser (TOML) is the daemon's.
func configCommand() *cli.Command { return handedOver("config", configUsage) }

// runCommand hands over: the pipeline engine (YAML, templates, the Temporal SDK) is not
// linked into the cli build, and a batch run does not notice the full binary's start.
func runCommand() *cli.Command { return handedOver("run", runUsage) }

// handedOver is a verb of the full build: the cli build runs deltabox-daemon with the same
// command line (help included).
func handedOver(name, usage string) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage + " (runs " + daemonBinary + ", installed next to deltabox)",
		SkipFlagParsing: true,
		Action:          func(*cli.Context) error { return execFullBinary("`deltabox " + name + "`") },
	}
}

// handOverOutput hands a command line with -o yaml over to the full build before anything
// runs: the cli build does not link yaml.v3, whose package initialiser and pages every call
// would pay (~50 page faults, ~1.5 ms on a VM where a page costs 30 us). Only -o yaml calls
// pay the full binary's start instead.
func handOverOutput(format string) error {
	if format != outYAML {
		return nil
	}
	return execFullBinary("-o yaml")
}

// printYAML is never reached in the cli build: run handed -o yaml over (handOverOutput).
func printYAML(io.Writer, any) error {
	return fmt.Errorf("-o yaml is printed by %s (the cli build hands it over before running)", daemonBinary)
}

// execFullBinary replaces this process with deltabox-daemon and the same arguments; what
// names the feature that needs it, for the error when it is missing.
func execFullBinary(what string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to start %s next to it: %w", daemonBinary, err)
	}
	full := filepath.Join(filepath.Dir(self), daemonBinary)
	if _, err := os.Stat(full); err != nil {
		return fmt.Errorf("%s runs %s, which should be installed next to %s: %w (make build builds both)", what, daemonBinary, self, err)
	}
	args := append([]string{full}, rawArgs[1:]...)
	return fmt.Errorf("start %s: %w", full, syscall.Exec(full, args, os.Environ()))
}
