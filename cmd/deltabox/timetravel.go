package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// logCommand prints a sandbox's storyboard (docs/time-travel.md).
func logCommand() *cli.Command {
	return &cli.Command{
		Name:      "log",
		Usage:     "a sandbox's storyboard: checkpoints with the state ops that led to them, the commands run and the effects after them",
		ArgsUsage: "ID",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "all", Usage: "every checkpoint of the tree (default: the current branch)"}},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "ID"); err != nil {
				return err
			}
			sb, err := newClient(c).Storyboard(c.Context, c.Args().First(), c.Bool("all"))
			if err != nil {
				return err
			}
			return printResult(c, sb, func(w io.Writer) { printStoryboard(w, sb) })
		},
	}
}

func printStoryboard(w io.Writer, sb api.Storyboard) {
	for _, e := range sb.Entries {
		ck := e.Checkpoint
		fmt.Fprintf(w, "checkpoint %s", treeLabel(ck))
		if ck.Parent != "" {
			fmt.Fprintf(w, " (after %s)", ck.Parent)
		}
		fmt.Fprintf(w, ": %d files changed, %s\n", ck.FilesChanged, ck.Created.Format("15:04:05.000"))
		for _, op := range e.StateOps {
			fmt.Fprintf(w, "  state #%d %s\n", op.Seq, op.Op)
		}
		for _, st := range e.Steps {
			exit := "error: " + st.Error
			if st.Exit != nil {
				exit = fmt.Sprintf("exit %d", st.Exit.Code)
				if st.Exit.Signal != "" {
					exit += " " + st.Exit.Signal
				}
			}
			fmt.Fprintf(w, "  $ %s  (%s, %.0f ms)\n", strings.Join(st.Argv, " "), exit, st.DurationMS)
			printOutput(w, "    | ", st.StdoutHead, st.StdoutTail, st.StdoutBytes)
			printOutput(w, "    ! ", st.StderrHead, st.StderrTail, st.StderrBytes)
		}
		for _, ef := range e.Effects {
			fmt.Fprintf(w, "  effect %s %s %s: %s\n", ef.ID, ef.Method, ef.URL, ef.Status)
		}
	}
}

// printOutput prints the kept head and tail of an output stream, at most a few lines each.
func printOutput(w io.Writer, prefix, head, tail string, total int64) {
	lines := func(s string) []string {
		l := strings.Split(strings.TrimRight(s, "\n"), "\n")
		if len(l) == 1 && l[0] == "" {
			return nil
		}
		return l
	}
	h := lines(head)
	if len(h) > 5 {
		h = h[:5]
	}
	for _, l := range h {
		fmt.Fprintln(w, prefix+l)
	}
	if tail != "" || int64(len(head)) < total {
		fmt.Fprintf(w, "%s... (%d bytes in all)\n", prefix, total)
		t := lines(tail)
		if len(t) > 3 {
			t = t[len(t)-3:]
		}
		for _, l := range t {
			fmt.Fprintln(w, prefix+l)
		}
	}
}

// showCommand prints a file as of a checkpoint.
func showCommand() *cli.Command {
	return &cli.Command{
		Name:      "show",
		Usage:     "print a file as of a checkpoint, without moving the sandbox",
		ArgsUsage: "ID CKPT:PATH",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 2, "ID CKPT:PATH"); err != nil {
				return err
			}
			ckpt, path, ok := strings.Cut(c.Args().Get(1), ":")
			if !ok || ckpt == "" || path == "" {
				return usagef("show takes ID CKPT:PATH (for example: show sb-1 @~1:/etc/hosts)")
			}
			info, err := newClient(c).ShowFile(c.Context, c.Args().Get(0), ckpt, path, c.App.Writer)
			if err != nil {
				return err
			}
			if info.Kind != "file" {
				fmt.Fprintf(c.App.Writer, "%s: %s", info.Path, info.Kind)
				if info.Target != "" {
					fmt.Fprintf(c.App.Writer, " -> %s", info.Target)
				}
				fmt.Fprintln(c.App.Writer)
			}
			return nil
		},
	}
}
