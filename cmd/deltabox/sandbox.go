package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

func leaseCommand() *cli.Command {
	return &cli.Command{
		Name: "lease", Usage: "take a ready sandbox from a pool and print its ID",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "pool", Required: true, Usage: "pool to lease from"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "K=V for this lease (repeatable)"},
			&cli.StringSliceFlag{Name: "label", Usage: "K=V label for this lease (repeatable)"},
			&cli.StringFlag{Name: "egress-policy", Usage: "egress policy YAML file for this lease (overrides the pool's)"},
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 0, ""); err != nil {
				return err
			}
			labels, err := parseKV(c.StringSlice("label"), "--label")
			if err != nil {
				return err
			}
			policy, err := readOptionalFile(c.String("egress-policy"))
			if err != nil {
				return err
			}
			l, err := newClient(c).Lease(c.Context, c.String("pool"), api.LeaseRequest{Env: c.StringSlice("env"), Labels: labels, EgressPolicy: policy})
			if err != nil {
				return err
			}
			return printResult(c, l, func(w io.Writer) { fmt.Fprintln(w, l.ID) })
		},
	}
}

func releaseCommand() *cli.Command {
	return &cli.Command{
		Name: "release", Usage: "give a sandbox back to its pool (its processes, files and env are wiped)", ArgsUsage: "ID",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "ID"); err != nil {
				return err
			}
			id := c.Args().First()
			if err := newClient(c).Release(c.Context, id); err != nil {
				return err
			}
			return printResult(c, map[string]string{"released": id}, func(w io.Writer) { fmt.Fprintln(w, id) })
		},
	}
}

func lsCommand() *cli.Command {
	return &cli.Command{
		Name: "ls", Usage: "list leased sandboxes (and quarantined ones, with the reason)",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 0, ""); err != nil {
				return err
			}
			sbs, err := newClient(c).Sandboxes(c.Context)
			if err != nil {
				return err
			}
			return printResult(c, sbs, func(w io.Writer) { printSandboxes(w, sbs) })
		},
	}
}

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name: "inspect", Usage: "show a leased sandbox", ArgsUsage: "ID",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "ID"); err != nil {
				return err
			}
			sb, err := newClient(c).Sandbox(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			return printResult(c, sb, func(w io.Writer) { printSandbox(w, sb) })
		},
	}
}

func printSandboxes(w io.Writer, sbs []api.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ID\tPOOL\tIMAGE\tLEASED\tSTATE")
	for _, s := range sbs {
		state := s.State
		if s.Reason != "" {
			state += ": " + s.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\t%s\n", s.ID, s.Pool, s.Image, time.Since(s.LeasedAt).Round(time.Second), state)
	}
}

func printSandbox(w io.Writer, s api.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "ID:\t%s\nPool:\t%s\nImage:\t%s\nContainer:\t%s\nLeased at:\t%s\nEnv:\t%s\n",
		s.ID, s.Pool, s.Image, s.Container, s.LeasedAt.Format(time.RFC3339), strings.Join(s.Env, " "))
	if s.State != "" {
		state := s.State
		if s.Reason != "" {
			state += ": " + s.Reason
		}
		fmt.Fprintf(tw, "State:\t%s\n", state)
	}
	fmt.Fprintf(tw, "Limits:\t%s\nSeccomp:\t%s\nUser namespace:\t%t\nCapabilities:\t%s\n", limitsText(s.Limits),
		orNone(s.Isolation.Seccomp), s.Isolation.UserNamespace, strings.Join(s.Isolation.Capabilities, " "))
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "Label:\t%s=%s\n", k, s.Labels[k])
	}
}

// readOptionalFile returns the content of path, or "" when path is empty.
func readOptionalFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return string(data), nil
}

func sandboxCommand() *cli.Command {
	return &cli.Command{
		Name: "sandbox", Usage: "decide about sandboxes quarantined at start (their record could not be trusted)",
		Subcommands: []*cli.Command{
			{
				Name: "adopt", Usage: "make a quarantined sandbox leased again, with its checkpoints and state", ArgsUsage: "ID",
				Flags: []cli.Flag{&cli.StringFlag{Name: "pool", Usage: "pool to adopt it into (default: the pool it was known by)"}},
				Action: func(c *cli.Context) error {
					if err := exactArgs(c, 1, "ID"); err != nil {
						return err
					}
					sb, err := newClient(c).Adopt(c.Context, c.Args().First(), c.String("pool"))
					if err != nil {
						return err
					}
					return printResult(c, sb, func(w io.Writer) { fmt.Fprintln(w, sb.ID) })
				},
			},
			{
				Name: "destroy", Usage: "destroy a quarantined sandbox with its checkpoints and state", ArgsUsage: "ID",
				Action: func(c *cli.Context) error {
					if err := exactArgs(c, 1, "ID"); err != nil {
						return err
					}
					id := c.Args().First()
					if err := newClient(c).DestroyQuarantined(c.Context, id); err != nil {
						return err
					}
					return printResult(c, map[string]string{"destroyed": id}, func(w io.Writer) { fmt.Fprintln(w, id) })
				},
			},
		},
	}
}
