package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func checkpointCommand() *cli.Command {
	return &cli.Command{
		Name:  "checkpoint",
		Usage: "take and list checkpoints of a sandbox",
		Subcommands: []*cli.Command{{
			Name: "create", Usage: "checkpoint a sandbox (files, agent state, effect watermark)", ArgsUsage: "ID",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "level", Usage: "l1 (delta; the default, with an automatic l2 after a long chain), l2 (full) or l3 (processes too)"},
				&cli.StringFlag{Name: "message", Aliases: []string{"m"}, Usage: "a note kept with the checkpoint"},
				&cli.StringFlag{Name: "name", Usage: "a name to refer to it by (docs/time-travel.md)"},
				&cli.BoolFlag{Name: "pin", Usage: "retention never drops it"},
				&cli.BoolFlag{Name: "async", Usage: "return once the sandbox runs again; the checkpoint becomes durable in the background (later operations on the sandbox wait for it)"},
				&cli.BoolFlag{Name: "processes", Usage: "keep the sandbox's processes too (l1/l2): a stopped copy-on-write template of each, from which a rollback starts fresh copies (default: the pool's checkpoint_processes)"},
			},
			Action: checkpointCreate,
		}, {
			Name: "ls", Usage: "list a sandbox's checkpoints (a tree: each names its parent)", ArgsUsage: "ID", Action: checkpointList,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "tree", Usage: "draw the checkpoint tree"}},
		}, {
			Name: "inspect", Usage: "show one checkpoint (CKPT: ID, name, @, @~N or lease)", ArgsUsage: "ID CKPT", Action: checkpointInspect,
		}, {
			Name: "pin", Usage: "keep a checkpoint through retention (--off: let it go again)", ArgsUsage: "ID CKPT", Action: checkpointPin,
			Flags: []cli.Flag{&cli.BoolFlag{Name: "off", Usage: "unpin"}},
		}},
	}
}

func checkpointCreate(c *cli.Context) error {
	if err := exactArgs(c, 1, "ID"); err != nil {
		return err
	}
	req := api.CheckpointRequest{Level: c.String("level"), Message: c.String("message"),
		Name: c.String("name"), Pin: c.Bool("pin"), Async: c.Bool("async")}
	if c.IsSet("processes") {
		v := c.Bool("processes")
		req.Processes = &v
	}
	ck, err := newClient(c).Checkpoint(c.Context, c.Args().First(), req)
	if err != nil {
		return err
	}
	return printResult(c, ck, func(w io.Writer) {
		fmt.Fprintf(w, "checkpoint %s (%s): %d files, %d bytes, frozen %.2f ms, total %.2f ms\n",
			ck.ID, ck.Level, ck.FilesChanged, ck.Bytes, ck.FrozenMS, ck.TotalMS)
		printProcesses(w, ck)
	})
}

func checkpointList(c *cli.Context) error {
	if err := exactArgs(c, 1, "ID"); err != nil {
		return err
	}
	cks, err := newClient(c).Checkpoints(c.Context, c.Args().First())
	if err != nil {
		return err
	}
	if c.Bool("tree") && outputFormat(c) != "json" {
		return printResult(c, cks, func(w io.Writer) { drawTree(w, cks) })
	}
	return printResult(c, cks, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		defer tw.Flush()
		fmt.Fprintln(tw, "ID\tLEVEL\tPARENT\tFILES\tBYTES\tSTATE_SEQ\tPROCS\tTEMPLATE_BYTES\tCOMMITTED\tCREATED\tMESSAGE")
		for _, k := range cks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%t\t%s\t%s\n", k.ID, k.Level, k.Parent, k.FilesChanged,
				k.Bytes, k.StateSeq, procSummary(k), k.TemplateBytes, k.Committed, k.Created.Format("15:04:05.000"), k.Message)
		}
	})
}

func checkpointInspect(c *cli.Context) error {
	if err := exactArgs(c, 2, "ID CKPT"); err != nil {
		return err
	}
	ck, err := newClient(c).InspectCheckpoint(c.Context, c.Args().Get(0), c.Args().Get(1))
	if err != nil {
		return err
	}
	return printResult(c, ck, func(w io.Writer) {
		fmt.Fprintf(w, "ID:\t%s\nLevel:\t%s\nParent:\t%s\nMessage:\t%s\nCreated:\t%s\nFiles changed:\t%d\nBytes:\t%d\nState seq:\t%d\nEffects watermark:\t%d\nCommitted:\t%t\n",
			ck.ID, ck.Level, ck.Parent, ck.Message, ck.Created, ck.FilesChanged, ck.Bytes, ck.StateSeq, ck.EffectsWatermark, ck.Committed)
		if ck.Processes != nil {
			fmt.Fprintf(w, "Template bytes:\t%d\n", ck.TemplateBytes)
		}
		printProcesses(w, ck)
	})
}

func rollbackCommand() *cli.Command {
	return &cli.Command{
		Name: "rollback", Usage: "return a sandbox's files, state and held effects to a checkpoint", ArgsUsage: "ID",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "to", Usage: "checkpoint anywhere in the tree: ID, name, @, @~N or lease (default: @, the head)"},
			&cli.BoolFlag{Name: "force", Usage: "roll back past the last commit (its effects stay sent)"},
			&cli.BoolFlag{Name: "replay", Usage: "from now on, requests of record rules get the recorded answers (docs/time-travel.md)"},
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "ID"); err != nil {
				return err
			}
			res, err := newClient(c).Rollback(c.Context, c.Args().First(), api.RollbackRequest{To: c.String("to"), Force: c.Bool("force"), Replay: c.Bool("replay")})
			if err != nil {
				return err
			}
			return printResult(c, res, func(w io.Writer) {
				fmt.Fprintf(w, "rolled back to %s: %d files restored, %d state ops undone, %d effects dropped, %d processes stopped, %d restored, frozen %.2f ms, total %.2f ms\n",
					res.To, res.FilesRestored, res.OpsUndone, res.EffectsDropped, res.ProcessesStopped, res.ProcessesRestored, res.FrozenMS, res.TotalMS)
				for _, p := range res.ProcessesLost {
					fmt.Fprintf(w, "not restored: pid %d (%s): %s\n", p.Pid, p.Comm, p.Reason)
				}
			})
		},
	}
}

func commitCommand() *cli.Command {
	return &cli.Command{
		Name: "commit", Usage: "send the sandbox's held effects and set its commit point", ArgsUsage: "ID",
		Description: "The commit point is the latest checkpoint: work done since is not protected and effects held\n" +
			"since stay held. --checkpoint takes a checkpoint of the current state first and commits up to it.\n" +
			"It is not the default: a commit is retried after failures and a second commit sends nothing again,\n" +
			"which holds only if a retry does not take new state; and it keeps the CLI's commit the API's.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "checkpoint", Aliases: []string{"c"}, Usage: "checkpoint the current state first and commit up to it"},
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "ID"); err != nil {
				return err
			}
			cl, id := newClient(c), c.Args().First()
			if c.Bool("checkpoint") {
				if _, err := cl.Checkpoint(c.Context, id, api.CheckpointRequest{Message: "commit --checkpoint"}); err != nil {
					return fmt.Errorf("checkpoint before the commit: %w", err)
				}
			}
			res, err := cl.Commit(c.Context, id)
			if err != nil {
				return err
			}
			return printResult(c, res, func(w io.Writer) {
				fmt.Fprintf(w, "committed at checkpoint %s: %d effects released, %d failed\n", res.Checkpoint, res.EffectsReleased, res.EffectsFailed)
			})
		},
	}
}

func diffCommand() *cli.Command {
	return &cli.Command{
		Name: "diff", Usage: "what changed between two checkpoints (or a checkpoint and now)", ArgsUsage: "ID [FROM [TO]] [PATH...]",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "from", Usage: "checkpoint reference (default: @, the head)"},
			&cli.StringFlag{Name: "to", Usage: "checkpoint reference (default: now)"},
		}, diffFlags()...),
		Action: diffAction,
	}
}

func printDiff(w io.Writer, d api.Diff) {
	to := d.To
	if to == "" {
		to = "now"
	}
	fmt.Fprintf(w, "diff %s: checkpoint %s -> %s\n", d.ID, d.From, to)
	fmt.Fprintf(w, "files (%d):\n", len(d.Files))
	for _, f := range d.Files {
		fmt.Fprintf(w, "  %-8s %-7s %8d  %s\n", f.Change, f.Kind, f.Size, f.Path)
	}
	fmt.Fprintf(w, "state ops (%d):\n", len(d.State))
	for _, s := range d.State {
		fmt.Fprintf(w, "  #%d %s\n", s.Seq, s.Op)
	}
	fmt.Fprintf(w, "effects (%d):\n", len(d.Effects))
	for _, e := range d.Effects {
		fmt.Fprintf(w, "  %s %-9s %s %s\n", e.ID, e.Status, e.Method, e.URL)
	}
}

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name: "verify", Usage: "check a sandbox's state log and files against a checkpoint", ArgsUsage: "ID [CKPT]",
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return usagef("verify takes ID [CKPT]")
			}
			res, err := newClient(c).Verify(c.Context, c.Args().Get(0), c.Args().Get(1))
			if err != nil {
				return err
			}
			if err := printResult(c, res, func(w io.Writer) {
				for _, p := range res.Problems {
					fmt.Fprintln(w, p)
				}
				if res.OK {
					fmt.Fprintf(w, "sandbox %s matches checkpoint %s\n", res.ID, res.Checkpoint)
				}
			}); err != nil {
				return err
			}
			if !res.OK {
				return fmt.Errorf("sandbox %s does not match checkpoint %s (%d problems)", res.ID, res.Checkpoint, len(res.Problems))
			}
			return nil
		},
	}
}

// procSummary is a checkpoint's processes in one word: "-" (files only) or "T/N"
// (templated of kept-or-not).
func procSummary(k api.Checkpoint) string {
	if k.Processes == nil {
		return "-"
	}
	n := 0
	for _, p := range k.Processes {
		if p.Kept == api.KeptTemplate {
			n++
		}
	}
	return fmt.Sprintf("%d/%d", n, len(k.Processes))
}

// printProcesses lists how a checkpoint keeps each process.
func printProcesses(w io.Writer, ck api.Checkpoint) {
	for _, p := range ck.Processes {
		fmt.Fprintf(w, "process %d (%s): %s", p.Pid, p.Comm, p.Kept)
		if p.Reason != "" {
			fmt.Fprintf(w, " (%s)", p.Reason)
		}
		fmt.Fprintln(w)
	}
}
