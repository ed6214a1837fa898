package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func poolCommand() *cli.Command {
	return &cli.Command{
		Name:  "pool",
		Usage: "manage warm sandbox pools",
		Subcommands: []*cli.Command{
			poolCreateCommand(),
			{Name: "ls", Usage: "list pools", Action: poolList},
			{Name: "rm", Usage: "remove a pool and destroy its ready sandboxes", ArgsUsage: "NAME", Action: poolRemove,
				Flags: []cli.Flag{&cli.BoolFlag{Name: "force", Usage: "also destroy its leased sandboxes"}}},
			{Name: "scale", Usage: "change how many sandboxes a pool keeps ready", ArgsUsage: "NAME", Action: poolScale,
				Flags: []cli.Flag{&cli.IntFlag{Name: "min-ready", Required: true, Usage: "ready sandboxes to keep"}}},
		},
	}
}

func poolCreateCommand() *cli.Command {
	return &cli.Command{
		Name: "create", Usage: "create a pool of warm sandboxes from an image", ArgsUsage: "NAME",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "image", Required: true, Usage: "image reference in containerd"},
			&cli.IntFlag{Name: "min-ready", Value: 1, Usage: "sandboxes kept ready"},
			&cli.IntFlag{Name: "max", Usage: "most sandboxes (ready + leased); default 4 x min-ready"},
			&cli.Float64Flag{Name: "cpus", Usage: "CPU limit in cores"},
			&cli.StringFlag{Name: "memory", Usage: "memory limit, e.g. 512m or 1g (default: [sandbox] memory)"},
			&cli.Int64Flag{Name: "pids", Usage: "most processes"},
			&cli.StringFlag{Name: "disk", Usage: "size of the writable layer, e.g. 2g (writes past it get ENOSPC)"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "K=V for every process (repeatable)"},
			&cli.StringFlag{Name: "workdir", Usage: "default working directory of exec"},
			&cli.StringSliceFlag{Name: "label", Usage: "K=V label (repeatable)"},
			&cli.StringFlag{Name: "egress-policy", Usage: "egress policy YAML file"},
			allowFlag,
			&cli.BoolFlag{Name: "checkpoint-processes", Usage: "checkpoints keep the processes too by default (checkpoint create --processes)"},
			&cli.BoolFlag{Name: "wait", Usage: "wait until min-ready sandboxes are ready (a bar on a terminal, progress lines with -o json)"},
			&cli.DurationFlag{Name: "wait-timeout", Value: 5 * time.Minute, Usage: "give up waiting after this long"},
			&cli.BoolFlag{Name: "no-userns", Usage: "run without a user namespace: root in the sandbox is host root (weaker)"},
		},
		Action: poolCreate,
	}
}

func poolCreate(c *cli.Context) error {
	if err := exactArgs(c, 1, "NAME"); err != nil {
		return err
	}
	t := api.Template{
		Name: c.Args().First(), Image: c.String("image"), MinReady: c.Int("min-ready"), Max: c.Int("max"),
		CPUs: c.Float64("cpus"), Pids: c.Int64("pids"), Env: c.StringSlice("env"), Workdir: c.String("workdir"),
		NoUserNamespace:     c.Bool("no-userns"),
		CheckpointProcesses: c.Bool("checkpoint-processes"),
	}
	var err error
	if t.Labels, err = parseKV(c.StringSlice("label"), "--label"); err != nil {
		return err
	}
	if m := c.String("memory"); m != "" {
		if t.MemoryBytes, err = parseSize("memory", m); err != nil {
			return usageError{err}
		}
	}
	if d := c.String("disk"); d != "" {
		if t.DiskBytes, err = parseSize("disk", d); err != nil {
			return usageError{err}
		}
	}
	if t.EgressPolicy, err = policyFromFlags(c); err != nil {
		return err
	}
	p, err := newClient(c).CreatePool(c.Context, t)
	if err != nil {
		return err
	}
	if c.Bool("wait") {
		if p, err = waitReady(c, p, c.Duration("wait-timeout")); err != nil {
			return err
		}
		if jsonOutput(c) { // JSON lines: the progress lines, then the pool on one line
			return printStreamResult(c, p, nil)
		}
	}
	return printResult(c, p, func(w io.Writer) { printPools(w, []api.PoolInfo{p}) })
}

// waitReady polls the pool until min_ready sandboxes are ready, reporting progress as
// snapshot transfers do (phase "ready", done/total in sandboxes).
func waitReady(c *cli.Context, p api.PoolInfo, timeout time.Duration) (api.PoolInfo, error) {
	progress := progressPrinter(c)
	deadline := time.Now().Add(timeout)
	last := -1
	for {
		if progress != nil && p.Ready != last && p.MinReady > 0 {
			progress(api.Progress{Phase: "ready", Blob: p.Name, Done: int64(min(p.Ready, p.MinReady)), Total: int64(p.MinReady)})
			last = p.Ready
		}
		if p.Ready >= p.MinReady {
			return p, nil
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("pool %q: %d of %d sandboxes ready after %s (see the daemon's log for why they fail): %w",
				p.Name, p.Ready, p.MinReady, timeout, context.DeadlineExceeded)
		}
		select {
		case <-c.Context.Done():
			return p, c.Context.Err()
		case <-time.After(100 * time.Millisecond):
		}
		var err error
		if p, err = newClient(c).Pool(c.Context, p.Name); err != nil {
			return p, err
		}
	}
}

func poolList(c *cli.Context) error {
	if err := exactArgs(c, 0, ""); err != nil {
		return err
	}
	ps, err := newClient(c).Pools(c.Context)
	if err != nil {
		return err
	}
	return printResult(c, ps, func(w io.Writer) { printPools(w, ps) })
}

func poolRemove(c *cli.Context) error {
	if err := exactArgs(c, 1, "NAME"); err != nil {
		return err
	}
	name := c.Args().First()
	if err := newClient(c).RemovePool(c.Context, name, c.Bool("force")); err != nil {
		return err
	}
	return printResult(c, map[string]string{"removed": name}, func(w io.Writer) { fmt.Fprintln(w, name) })
}

func poolScale(c *cli.Context) error {
	if err := exactArgs(c, 1, "NAME"); err != nil {
		return err
	}
	p, err := newClient(c).ScalePool(c.Context, c.Args().First(), c.Int("min-ready"))
	if err != nil {
		return err
	}
	return printResult(c, p, func(w io.Writer) { printPools(w, []api.PoolInfo{p}) })
}

func printPools(w io.Writer, ps []api.PoolInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "NAME\tIMAGE\tREADY\tLEASED\tCREATING\tMIN_READY\tMAX\tUSERNS\tLIMITS")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%t\t%s\n", p.Name, p.Image, p.Ready, p.Leased, p.Creating, p.MinReady, p.Max,
			p.Isolation.UserNamespace, limitsText(p.Limits))
	}
}

// parseKV parses repeated K=V flags into a map.
func parseKV(items []string, flag string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(items))
	for _, kv := range items {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("%s %q: want K=V", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}

// parseSize parses a size such as "512m", "1g", "256MiB" or a byte count; what names the flag.
func parseSize(what, s string) (int64, error) {
	n, err := units.RAMInBytes(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q: want a size such as 512m or 1g: %w", what, s, errdefs.ErrInvalidArgument)
	}
	return n, nil
}
