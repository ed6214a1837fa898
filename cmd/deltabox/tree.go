package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// drawTree draws a sandbox's checkpoint tree, children in creation order, the head marked
// with "@" and the commit point's path with "committed".
func drawTree(w io.Writer, cks []api.Checkpoint) {
	kids := map[string][]api.Checkpoint{}
	known := map[string]bool{}
	for _, c := range cks {
		known[c.ID] = true
	}
	var roots []api.Checkpoint
	for _, c := range cks {
		if c.Parent == "" || !known[c.Parent] {
			roots = append(roots, c)
			continue
		}
		kids[c.Parent] = append(kids[c.Parent], c)
	}
	var walk func(c api.Checkpoint, prefix string, last, root bool)
	walk = func(c api.Checkpoint, prefix string, last, root bool) {
		branch, next := "├── ", prefix+"│   "
		if last {
			branch, next = "└── ", prefix+"    "
		}
		if root {
			branch, next = "", prefix
		}
		fmt.Fprintf(w, "%s%s%s\n", prefix, branch, treeLabel(c))
		ks := kids[c.ID]
		for i, k := range ks {
			walk(k, next, i == len(ks)-1, false)
		}
	}
	for _, r := range roots {
		walk(r, "", true, true)
	}
}

// treeLabel is one checkpoint's line in the tree.
func treeLabel(c api.Checkpoint) string {
	parts := []string{c.ID}
	if c.Name != "" {
		parts = append(parts, "("+c.Name+")")
	}
	parts = append(parts, c.Level)
	var tags []string
	if c.Head {
		tags = append(tags, "@")
	}
	if c.Committed {
		tags = append(tags, "committed")
	}
	if c.Pinned {
		tags = append(tags, "pinned")
	}
	if len(tags) > 0 {
		parts = append(parts, "["+strings.Join(tags, ", ")+"]")
	}
	if c.Message != "" {
		parts = append(parts, c.Message)
	}
	return strings.Join(parts, " ")
}

// checkpointPin is `checkpoint pin ID CKPT [--off]`.
func checkpointPin(c *cli.Context) error {
	if err := exactArgs(c, 2, "ID CKPT"); err != nil {
		return err
	}
	ck, err := newClient(c).Pin(c.Context, c.Args().Get(0), c.Args().Get(1), !c.Bool("off"))
	if err != nil {
		return err
	}
	return printResult(c, ck, func(w io.Writer) { fmt.Fprintf(w, "checkpoint %s pinned: %t\n", ck.ID, ck.Pinned) })
}

// gotoCommand is rollback under the name for moving anywhere in the tree: `goto ID CKPT`.
func gotoCommand() *cli.Command {
	return &cli.Command{
		Name:      "goto",
		Usage:     "move a sandbox to any checkpoint of its tree (rollback --to, reads better across branches)",
		ArgsUsage: "ID CKPT",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "force", Usage: "move behind the last commit (its effects stay sent)"},
			&cli.BoolFlag{Name: "replay", Usage: "from now on, requests of record rules get the recorded answers (docs/time-travel.md)"},
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 2, "ID CKPT"); err != nil {
				return err
			}
			res, err := newClient(c).Rollback(c.Context, c.Args().Get(0), api.RollbackRequest{To: c.Args().Get(1), Force: c.Bool("force"), Replay: c.Bool("replay")})
			if err != nil {
				return err
			}
			return printResult(c, res, func(w io.Writer) {
				fmt.Fprintf(w, "moved from %s to %s: %d files restored, %d state ops undone or replayed, %d effects dropped, %d processes stopped, frozen %.2f ms, total %.2f ms\n",
					res.From, res.To, res.FilesRestored, res.OpsUndone, res.EffectsDropped, res.ProcessesStopped, res.FrozenMS, res.TotalMS)
			})
		},
	}
}
