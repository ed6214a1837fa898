package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/version"
	"github.com/deltabox/deltabox/orchestrator/client"
)

// Exit codes of the CLI (docs/design.md, "Contracts"); `exec` exits with the command's own code.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks a command line the CLI cannot make sense of (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitCodeError carries a specific exit code (for `exec`) without printing anything.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func run(args []string, stdout, stderr io.Writer) int {
	rawArgs = args
	app := newApp(stdout, stderr)
	err := app.Run(reorderArgs(app, args))
	if err != nil && strings.HasPrefix(err.Error(), "Required flag") {
		err = usageError{err}
	}
	var code exitCodeError
	var usage usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return code.code
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "deltabox: %v\nRun 'deltabox --help' for usage.\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "deltabox: %v\n", err)
		return exitError
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:            "deltabox",
		Usage:           "checkpoint and roll back AI agent sandboxes in milliseconds",
		Version:         version.Version + " (" + version.Commit + ")",
		Writer:          stdout,
		ErrWriter:       stderr,
		HideVersion:     true,
		ExitErrHandler:  func(*cli.Context, error) {},
		CommandNotFound: func(c *cli.Context, name string) {},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "address", Aliases: []string{"a"}, Value: client.DefaultAddress,
				EnvVars: []string{"DELTABOX_ADDRESS"}, Usage: "daemon API socket"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "text", Usage: "output format: text or json"},
		},
		Before:   validateGlobal,
		Commands: commands(),
	}
	app.OnUsageError = onUsageError
	markUsageErrors(app.Commands)
	return app
}

func commands() []*cli.Command {
	return []*cli.Command{
		versionCommand(), daemonCommand(), infoCommand(), configCommand(),
		poolCommand(), leaseCommand(), releaseCommand(), lsCommand(), inspectCommand(), sandboxCommand(),
		execCommand(), cpCommand(), checkpointCommand(), rollbackCommand(), commitCommand(),
		diffCommand(), stateCommand(), verifyCommand(), effectsCommand(), snapshotCommand(), restoreCommand(), forkCommand(), docsCommand(),
		runCommand(),
	}
}

func onUsageError(_ *cli.Context, err error, _ bool) error { return usageError{err} }

// markUsageErrors makes flag-parsing errors of every (sub)command usage errors (exit 2) and
// rejects unknown subcommands.
func markUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = onUsageError
		if len(c.Subcommands) > 0 && c.Action == nil {
			c.Action = func(ctx *cli.Context) error {
				if ctx.NArg() > 0 {
					return usagef("unknown command %q for %q", ctx.Args().First(), ctx.Command.FullName())
				}
				return usagef("%q needs a subcommand", ctx.Command.FullName())
			}
		}
		markUsageErrors(c.Subcommands)
	}
}

func validateGlobal(c *cli.Context) error {
	switch c.String("output") {
	case "text", "json":
	default:
		return usagef("--output %q: want text or json", c.String("output"))
	}
	if c.NArg() > 0 && c.App.Command(c.Args().First()) == nil {
		return usagef("unknown command %q", c.Args().First())
	}
	return nil
}

// newClient returns an API client for the socket named by --address.
func newClient(c *cli.Context) *client.Client { return client.New(c.String("address")) }

// jsonOutput reports whether -o json was asked for.
func jsonOutput(c *cli.Context) bool { return c.String("output") == "json" }

// printResult prints v as one JSON document with -o json, or through text otherwise.
func printResult(c *cli.Context, v any, text func(w io.Writer)) error {
	if jsonOutput(c) {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(c.App.Writer)
	return nil
}

// exactArgs checks the number of positional arguments.
func exactArgs(c *cli.Context, n int, names string) error {
	if c.NArg() != n {
		return usagef("%s takes %d argument(s): %s (got %d)", c.Command.FullName(), n, names, c.NArg())
	}
	return nil
}
