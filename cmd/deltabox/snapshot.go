package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func snapshotCommand() *cli.Command {
	return &cli.Command{
		Name:  "snapshot",
		Usage: "L3 snapshots (processes, files, state) in object storage",
		Subcommands: []*cli.Command{{
			Name: "push", Usage: "take an L3 checkpoint of a sandbox and upload it", ArgsUsage: "ID",
			Flags:  []cli.Flag{&cli.StringFlag{Name: "to", Usage: "object store URI (file:///path or s3://bucket/prefix?endpoint=host:port&tls=false); default: the daemon's"}},
			Action: snapshotPush,
		}, {
			Name: "ls", Usage: "list the snapshots in a store", ArgsUsage: "[STORE_URI]", Action: snapshotList,
		}, {
			Name: "rm", Usage: "delete a snapshot (and the blobs only it used)", ArgsUsage: "URI", Action: snapshotRemove,
		}},
	}
}

func restoreCommand() *cli.Command {
	return &cli.Command{
		Name: "restore", Usage: "create a sandbox from a snapshot (processes included) and lease it", ArgsUsage: "URI",
		Flags:  []cli.Flag{&cli.StringFlag{Name: "pool", Usage: "pool to restore into (default: the snapshot's)"}},
		Action: runRestore,
	}
}

func forkCommand() *cli.Command {
	return &cli.Command{
		Name: "fork", Usage: "snapshot a sandbox once and restore it N times", ArgsUsage: "ID",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "count", Value: 2, Usage: "number of forks"},
			&cli.StringFlag{Name: "to", Usage: "object store URI for the snapshot (default: the daemon's)"},
			&cli.BoolFlag{Name: "keep-snapshot", Usage: "keep the snapshot the fork pushes (default: removed once the forks are restored)"},
			&cli.BoolFlag{Name: "replay", Usage: "with --from: the forks replay the source's recorded answers (docs/time-travel.md)"},
			&cli.StringFlag{Name: "from", Usage: "fork from this checkpoint on this node, without a snapshot: files and state, fresh processes (docs/time-travel.md)"},
		},
		Action: runFork,
	}
}

// progressPrinter shows progress: JSON lines with -o json, a bar on a terminal, else nothing.
func progressPrinter(c *cli.Context) func(api.Progress) {
	if jsonOutput(c) {
		enc := json.NewEncoder(c.App.Writer)
		return func(p api.Progress) { _ = enc.Encode(map[string]api.Progress{"progress": p}) }
	}
	if st, err := os.Stderr.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return func(p api.Progress) {
		pct := 100
		if p.Total > 0 {
			pct = int(p.Done * 100 / p.Total)
		}
		bar := fmt.Sprintf("%-20s", string([]rune("####################")[:pct/5]))
		amount := humanBytes(p.Total)
		if p.Phase == "ready" { // pool create --wait counts sandboxes
			amount = fmt.Sprintf("%d/%d sandboxes", p.Done, p.Total)
		}
		fmt.Fprintf(c.App.ErrWriter, "\r%-9s %-22s [%s] %3d%% %s", p.Phase, p.Blob, bar, pct, amount)
		if pct == 100 {
			fmt.Fprintln(c.App.ErrWriter)
		}
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func snapshotPush(c *cli.Context) error {
	if err := exactArgs(c, 1, "ID"); err != nil {
		return err
	}
	snap, err := newClient(c).SnapshotPush(c.Context, c.Args().First(), c.String("to"), progressPrinter(c))
	if err != nil {
		return err
	}
	return printStreamResult(c, snap, func(w io.Writer) {
		fmt.Fprintf(w, "%s\n  %s, frozen %.0f ms, package %.0f ms, upload %.0f ms (%s sent)\n", snap.URI,
			humanBytes(snap.Size), snap.FrozenMS, snap.PackageMS, snap.UploadMS, humanBytes(snap.Uploaded))
	})
}

func snapshotList(c *cli.Context) error {
	if c.NArg() > 1 {
		return usagef("snapshot ls takes at most one STORE_URI")
	}
	snaps, err := newClient(c).Snapshots(c.Context, c.Args().First())
	if err != nil {
		return err
	}
	return printResult(c, snaps, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		defer tw.Flush()
		fmt.Fprintln(tw, "NAME\tSANDBOX\tCHECKPOINT\tIMAGE\tSIZE\tCREATED")
		for _, s := range snaps {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Sandbox, s.Checkpoint, s.Image, humanBytes(s.Size), s.Created.Format("2006-01-02 15:04:05"))
		}
	})
}

func snapshotRemove(c *cli.Context) error {
	if err := exactArgs(c, 1, "URI"); err != nil {
		return err
	}
	uri := c.Args().First()
	if err := newClient(c).SnapshotRemove(c.Context, uri); err != nil {
		return err
	}
	return printResult(c, map[string]string{"removed": uri}, func(w io.Writer) { fmt.Fprintln(w, uri) })
}

func runRestore(c *cli.Context) error {
	if err := exactArgs(c, 1, "URI"); err != nil {
		return err
	}
	l, err := newClient(c).Restore(c.Context, c.Args().First(), c.String("pool"), progressPrinter(c))
	if err != nil {
		return err
	}
	return printStreamResult(c, l, func(w io.Writer) { fmt.Fprintln(w, l.ID) })
}

func runFork(c *cli.Context) error {
	if err := exactArgs(c, 1, "ID"); err != nil {
		return err
	}
	req := api.SnapshotRequest{To: c.String("to"), Count: c.Int("count"), KeepSnapshot: c.Bool("keep-snapshot"), From: c.String("from"), Replay: c.Bool("replay")}
	leases, err := newClient(c).ForkWith(c.Context, c.Args().First(), req, progressPrinter(c))
	if err != nil {
		return err
	}
	return printStreamResult(c, leases, func(w io.Writer) {
		for _, l := range leases {
			fmt.Fprintln(w, l.ID)
		}
	})
}

// printStreamResult ends a streamed verb: with -o json the result is one more JSON line after
// the progress lines.
func printStreamResult(c *cli.Context, v any, text func(w io.Writer)) error {
	if jsonOutput(c) {
		return json.NewEncoder(c.App.Writer).Encode(v)
	}
	text(c.App.Writer)
	return nil
}
