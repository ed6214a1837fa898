package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func effectsCommand() *cli.Command {
	return &cli.Command{
		Name:  "effects",
		Usage: "outbound requests a sandbox made through the egress proxy",
		Subcommands: []*cli.Command{{
			Name: "ls", Usage: "list a sandbox's effects (with delivery progress: attempts, last error, next attempt)", ArgsUsage: "ID",
			Flags:  []cli.Flag{&cli.StringFlag{Name: "status", Usage: "held, sending, released, dropped, failed, compensated, abandoned, passed or denied"}},
			Action: effectsList,
		}, {
			Name: "show", Usage: "show one effect with every delivery attempt", ArgsUsage: "ID EFFECT", Action: effectShow,
		}, {
			Name:      "retry",
			Usage:     "send failed effects again (the named one, or every failed one), with the same Idempotency-Key; exits non-zero if any fails again",
			ArgsUsage: "ID [EFFECT]", Action: effectsRetry,
		}, {
			Name: "abandon", Usage: "give up a failed effect: it is never sent", ArgsUsage: "ID EFFECT", Action: effectAbandon,
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
	return printResult(c, e, func(w io.Writer) {
		printEffects(w, []api.Effect{e})
		printAttempts(w, e.History)
		printEffectRequest(w, e)
	})
}

func effectsRetry(c *cli.Context) error {
	if c.NArg() < 1 || c.NArg() > 2 {
		return usagef("%s takes 1 or 2 arguments: ID [EFFECT] (got %d)", c.Command.FullName(), c.NArg())
	}
	var names []string
	if c.NArg() == 2 {
		names = []string{c.Args().Get(1)}
	}
	res, err := newClient(c).RetryEffects(c.Context, c.Args().First(), names...)
	if err != nil {
		return err
	}
	return printResult(c, res, func(w io.Writer) {
		fmt.Fprintf(w, "released %d, failed %d\n", res.EffectsReleased, res.EffectsFailed)
		printEffects(w, res.Effects)
	})
}

func effectAbandon(c *cli.Context) error {
	if err := exactArgs(c, 2, "ID EFFECT"); err != nil {
		return err
	}
	e, err := newClient(c).AbandonEffect(c.Context, c.Args().Get(0), c.Args().Get(1))
	if err != nil {
		return err
	}
	return printResult(c, e, func(w io.Writer) { printEffects(w, []api.Effect{e}) })
}

func printEffects(w io.Writer, es []api.Effect) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ID\tSEQ\tCHECKPOINT\tSTATUS\tMETHOD\tURL\tRESPONSE\tATTEMPTS\tNEXT ATTEMPT\tLAST ERROR")
	suspect := false
	defer func() {
		tw.Flush() // the table before the note
		if suspect {
			fmt.Fprintln(w, "* the sandbox's effect journal is damaged: a starred status may be wrong and commits are refused;\n  decide each effect with `deltabox effects retry|abandon` (see `deltabox commit` for the damage)")
		}
	}()
	for _, e := range es {
		status := e.Status
		if e.Suspect {
			status, suspect = status+"*", true
		}
		next := "-"
		if e.NextAttempt != nil {
			next = e.NextAttempt.Format(time.RFC3339)
		}
		lastErr := e.Error
		if lastErr == "" {
			lastErr = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", e.ID, e.Seq, e.Checkpoint, status, e.Method, e.URL,
			e.ResponseStatus, e.Attempts, next, lastErr)
	}
}

func printAttempts(w io.Writer, as []api.EffectAttempt) {
	if len(as) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "\nATTEMPT\tTIME\tSTATUS\tERROR")
	for i, a := range as {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", i+1, a.Time.Format(time.RFC3339Nano), a.Status, a.Error)
	}
}

// printEffectRequest prints the request an effect holds: the request line, headers in
// order, and the body (text, or its size when it is binary).
func printEffectRequest(w io.Writer, e api.Effect) {
	r := e.Request
	if r == nil {
		return
	}
	fmt.Fprintf(w, "\nRequest:\n%s %s\n", e.Method, e.URL)
	if r.Compacted {
		fmt.Fprintln(w, "(headers and body dropped by the journal's compaction)")
		return
	}
	keys := make([]string, 0, len(r.Headers))
	for k := range r.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Headers[k] {
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
	}
	switch {
	case r.Bytes == 0:
	case r.BodyBase64 != nil:
		fmt.Fprintf(w, "\n(%d bytes of binary body; -o json has it in body_base64)\n", r.Bytes)
	default:
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(r.Body, "\n"))
	}
}
