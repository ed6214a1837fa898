package main

import (
	"errors"
	"fmt"
	"io"
	"os"
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
	keepArgs(args)
	app := newApp(stdout, stderr)
	if len(args) == 0 || args[len(args)-1] != completionFlag { // urfave/cli wants it last
		args = reorderArgs(app, args)
	}
	err := handOverOutput(outputFromArgs(app, args)) // returns only if it did not hand over
	if err == nil {
		err = app.Run(args)
	}
	if err != nil && strings.HasPrefix(err.Error(), "Required flag") {
		err = usageError{err}
	}
	var code exitCodeError
	var usage usageError
	exit := exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return code.code
	case errors.As(err, &usage):
		exit = exitUsage
	}
	printError(stderr, err, exit, outputFromArgs(app, args) == outJSON)
	return exit
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:            "deltabox",
		Usage:           "checkpoint and roll back AI agent sandboxes in milliseconds",
		Version:         version.Version + " (" + version.Commit + ")",
		Writer:          stdout,
		ErrWriter:       stderr,
		HideVersion:     false,
		ExitErrHandler:  func(*cli.Context, error) {},
		CommandNotFound: func(c *cli.Context, name string) {},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "address", Aliases: []string{"a"}, Value: client.DefaultAddress,
				EnvVars: []string{"DELTABOX_ADDRESS"}, Usage: "daemon API: its unix socket, or tcp://host:port (TLS and a token)"},
			&cli.StringFlag{Name: "token-file", EnvVars: []string{"DELTABOX_TOKEN_FILE"},
				Usage: "`FILE` whose first line is the bearer token for a tcp:// address (or set DELTABOX_TOKEN)"},
			&cli.StringFlag{Name: "ca-file", EnvVars: []string{"DELTABOX_CA_FILE"},
				Usage: "PEM `FILE` of the CA (or the daemon's self-signed certificate) a tcp:// daemon's certificate must chain to"},
			&cli.StringFlag{Name: "cert-file", EnvVars: []string{"DELTABOX_CERT_FILE"}, Usage: "client certificate `FILE` (PEM) for a tcp:// daemon that asks for one"},
			&cli.StringFlag{Name: "key-file", EnvVars: []string{"DELTABOX_KEY_FILE"}, Usage: "key `FILE` (PEM) of --cert-file"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "text", Usage: "output `FORMAT`: text, wide, json or yaml (before or after the verb)"},
			&cli.StringFlag{Name: "format", Usage: "print with a Go `TEMPLATE` over the JSON fields, e.g. '{{.sandbox}} {{.pool}}' (once per item of a list)"},
		},
		Before:               validateGlobal,
		Commands:             commands(),
		EnableBashCompletion: true,
	}
	app.OnUsageError = onUsageError
	markUsageErrors(app.Commands)
	completeSandboxIDs(app.Commands)
	return app
}

func commands() []*cli.Command {
	return []*cli.Command{
		versionCommand(), daemonCommand(), infoCommand(), configCommand(),
		poolCommand(), leaseCommand(), releaseCommand(), lsCommand(), inspectCommand(), sandboxCommand(),
		execCommand(), cpCommand(), checkpointCommand(), rollbackCommand(), gotoCommand(), logCommand(), showCommand(), uiCommand(), commitCommand(),
		diffCommand(), stateCommand(), verifyCommand(), effectsCommand(), snapshotCommand(), restoreCommand(), forkCommand(), docsCommand(),
		runCommand(), completionCommand(), logsCommand(), psCommand(), policyCommand(),
	}
}

func onUsageError(_ *cli.Context, err error, _ bool) error { return usageError{err} }

// markUsageErrors makes flag-parsing errors of every (sub)command usage errors (exit 2);
// a command group given no subcommand lists its subcommands, and an unknown one is
// refused with a suggestion.
func markUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = onUsageError
		if len(c.Subcommands) > 0 && c.Action == nil {
			c.Action = func(ctx *cli.Context) error {
				if ctx.NArg() > 0 {
					return usagef("unknown command %q for %q%s", ctx.Args().First(), ctx.Command.FullName(),
						suggest(ctx.Args().First(), ctx.Command.Subcommands))
				}
				cli.HelpPrinter(ctx.App.ErrWriter, cli.SubcommandHelpTemplate, ctx.Command)
				return usagef("%q needs a subcommand (listed above)", ctx.Command.FullName())
			}
		}
		markUsageErrors(c.Subcommands)
	}
}

func validateGlobal(c *cli.Context) error {
	switch outputFormat(c) {
	case outText, outWide, outJSON, outYAML:
	default:
		return usagef("--output %q: want text, wide, json or yaml", outputFormat(c))
	}
	if c.NArg() > 0 && c.App.Command(c.Args().First()) == nil {
		return usagef("unknown command %q%s", c.Args().First(), suggest(c.Args().First(), c.App.Commands))
	}
	return nil
}

// newClient returns an API client for the daemon named by --address (a bad address, token or
// certificate fails its first request).
func newClient(c *cli.Context) *client.Client {
	addr := c.String("address")
	o := client.Options{CAFile: c.String("ca-file"), CertFile: c.String("cert-file"), KeyFile: c.String("key-file"), OneShot: true}
	if strings.HasPrefix(addr, "tcp://") {
		token, err := readToken(c.String("token-file"))
		if err != nil {
			return client.Failed(addr, err)
		}
		o.Token = token
	}
	cl, err := client.Dial(addr, o)
	if err != nil {
		return client.Failed(addr, err)
	}
	return cl
}

// readToken returns DELTABOX_TOKEN, or the first line of file that is not blank or a comment.
func readToken(file string) (string, error) {
	if t := os.Getenv("DELTABOX_TOKEN"); t != "" {
		return t, nil
	}
	if file == "" {
		return "", nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("token file %s holds no token", file)
}

// exactArgs checks the number of positional arguments.
func exactArgs(c *cli.Context, n int, names string) error {
	if c.NArg() != n {
		return usagef("%s takes %d argument(s): %s (got %d)", c.Command.FullName(), n, names, c.NArg())
	}
	return nil
}
