//go:build cli

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"
)

// daemonBinary is the full build the cli build hands `daemon` over to.
const daemonBinary = "deltabox-daemon"

// rawArgs are the command line as given (before reorderArgs), for handing over to the full
// binary unchanged.
var rawArgs []string

func keepArgs(args []string) { rawArgs = args }

// daemonCommand in the cli build hands the whole command line over to deltabox-daemon.
func daemonCommand() *cli.Command { return handedOver("daemon", daemonUsage) }

// policyCommand in the cli build hands over too: checking a policy needs the proxy's parser.
func policyCommand() *cli.Command {
	return handedOver("policy", "egress policies: print the default, check a file")
}

// handedOver is a verb of the full build: the cli build runs deltabox-daemon with the same
// command line (help included).
func handedOver(name, usage string) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage + " (runs " + daemonBinary + ", installed next to deltabox)",
		SkipFlagParsing: true,
		Action:          func(*cli.Context) error { return execFullBinary() },
	}
}

// execFullBinary replaces this process with deltabox-daemon and the same arguments.
func execFullBinary() error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to start %s next to it: %w", daemonBinary, err)
	}
	full := filepath.Join(filepath.Dir(self), daemonBinary)
	if _, err := os.Stat(full); err != nil {
		return fmt.Errorf("`deltabox daemon` runs %s, which should be installed next to %s: %w (make build builds both)", daemonBinary, self, err)
	}
	args := append([]string{full}, rawArgs[1:]...)
	return fmt.Errorf("start %s: %w", full, syscall.Exec(full, args, os.Environ()))
}
