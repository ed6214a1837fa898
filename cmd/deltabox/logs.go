package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name: "logs", Usage: "print the output of a detached exec (exec -d); the latest one without PROC", ArgsUsage: "ID [PROC]",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "wait for more output until the command ends"}},
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return usagef("logs takes ID [PROC] (got %d argument(s))", c.NArg())
			}
			cl, id, proc := newClient(c), c.Args().Get(0), c.Args().Get(1)
			if proc == "" {
				ps, err := cl.Procs(c.Context, id)
				if err != nil {
					return err
				}
				if len(ps) == 0 {
					return fmt.Errorf("sandbox %q has no detached exec (start one with exec -d): %w", id, errdefs.ErrNotFound)
				}
				proc = ps[len(ps)-1].Proc
			}
			stdout, stderr := io.Writer(c.App.Writer), io.Writer(c.App.ErrWriter)
			var jw *jsonLines
			if jsonOutput(c) {
				jw = &jsonLines{enc: json.NewEncoder(c.App.Writer)}
				stdout, stderr = jw.stream("stdout"), jw.stream("stderr")
			}
			st, err := cl.Logs(c.Context, id, proc, c.Bool("follow"), stdout, stderr)
			if err != nil {
				return err
			}
			if jw != nil && st != nil {
				jw.emit(map[string]any{"exit": st})
			}
			return nil
		},
	}
}

func psCommand() *cli.Command {
	return &cli.Command{
		Name: "ps", Usage: "list a sandbox's detached execs (exec -d; they survive a daemon restart)", ArgsUsage: "ID",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "ID"); err != nil {
				return err
			}
			ps, err := newClient(c).Procs(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			return printResult(c, ps, func(w io.Writer) { printProcs(w, ps) })
		},
	}
}

func printProcs(w io.Writer, ps []api.Proc) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "PROC\tSTARTED\tSTATE\tCOMMAND")
	for _, p := range ps {
		state := p.State
		switch {
		case p.Exit != nil:
			state = fmt.Sprintf("exited %d", p.Exit.Code)
		case p.Error != "":
			state = "failed: " + p.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Proc, p.Started.Local().Format(time.DateTime), state, strings.Join(p.Argv, " "))
	}
}
