package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func effectsCommand() *cli.Command {
	return &cli.Command{
		Name:  "effects",
		Usage: "outbound requests a sandbox made through the egress proxy",
		Subcommands: []*cli.Command{{
			Name: "ls", Usage: "list a sandbox's effects", ArgsUsage: "ID",
			Flags:  []cli.Flag{&cli.StringFlag{Name: "status", Usage: "held, released, dropped, failed, compensated, passed or denied"}},
			Action: effectsList,
		}, {
			Name: "show", Usage: "show one effect", ArgsUsage: "ID EFFECT", Action: effectShow,
		}},
	}
}

func effectsList(c *cli.Context) error {
	if err := exactArgs(c, 1, "ID"); err != nil {
		return err
	}
	es, err := newClient(c).Effects(c.Context, c.Args().First(), c.String("status"))
	if err != nil {
		return err
	}
	return printResult(c, es, func(w io.Writer) { printEffects(w, es) })
}

func effectShow(c *cli.Context) error {
	if err := exactArgs(c, 2, "ID EFFECT"); err != nil {
		return err
	}
	e, err := newClient(c).Effect(c.Context, c.Args().Get(0), c.Args().Get(1))
	if err != nil {
		return err
	}
	return printResult(c, e, func(w io.Writer) { printEffects(w, []api.Effect{e}) })
}

func printEffects(w io.Writer, es []api.Effect) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ID\tSEQ\tCHECKPOINT\tSTATUS\tMETHOD\tURL\tRESPONSE\tATTEMPTS")
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\n", e.ID, e.Seq, e.Checkpoint, e.Status, e.Method, e.URL, e.ResponseStatus, e.Attempts)
	}
}
