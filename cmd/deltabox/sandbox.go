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
			allowFlag,
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 0, ""); err != nil {
				return err
			}
			labels, err := parseKV(c.StringSlice("label"), "--label")
			if err != nil {
				return err
			}
			policy, err := policyFromFlags(c)
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
		Name: "release", Usage: "give sandboxes back to their pool (their processes, files and env are wiped)", ArgsUsage: "ID [ID...]",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return usagef("release takes one or more sandbox IDs")
			}
			cl := newClient(c)
			return forEachID(c, func(id string) (any, error) {
				return map[string]string{"released": id}, cl.Release(c.Context, id)
			})
		},
	}
}

// forEachID runs fn on every ID argument, as docker does for `rm a b c`: it goes on after a
// failure, prints each ID done (or, with -o json, one document: fn's result for one ID, a
// list for several), reports each failure on stderr and fails if any did.
func forEachID(c *cli.Context, fn func(id string) (any, error)) error {
	var done []any
	var failed error
	for _, id := range c.Args().Slice() {
		res, err := fn(id)
		if err != nil {
			if c.NArg() == 1 {
				return err
			}
			printError(c.App.ErrWriter, fmt.Errorf("%s: %w", id, err), exitError, outputFormat(c) == outJSON)
			failed = exitCodeError{code: exitError}
			continue
		}
		done = append(done, res)
		if !jsonOutput(c) && c.String("format") == "" {
			fmt.Fprintln(c.App.Writer, id)
		}
	}
	if jsonOutput(c) || c.String("format") != "" {
		var v any = done
		if c.NArg() == 1 {
			v = done[0]
		} else if done == nil {
			v = []any{}
		}
		if err := printResult(c, v, func(io.Writer) {}); err != nil {
			return err
		}
	}
	return failed
}

func lsCommand() *cli.Command {
	return &cli.Command{
		Name: "ls", Usage: "list leased sandboxes (and quarantined ones, with the reason)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print only the sandbox IDs"},
			&cli.StringSliceFlag{Name: "filter", Aliases: []string{"f"}, Usage: "keep sandboxes matching `KEY=VALUE` (label=K=V or label=K, pool=P, state=S, image=I); repeatable or comma-separated, all must match"},
		},
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 0, ""); err != nil {
				return err
			}
			match, err := parseSandboxFilters(c.StringSlice("filter"))
			if err != nil {
				return err
			}
			all, err := newClient(c).Sandboxes(c.Context)
			if err != nil {
				return err
			}
			sbs := []api.Sandbox{}
			for _, s := range all {
				if match(s) {
					sbs = append(sbs, s)
				}
			}
			if c.Bool("quiet") {
				for _, s := range sbs {
					fmt.Fprintln(c.App.Writer, s.ID)
				}
				return nil
			}
			return printResult(c, sbs, func(w io.Writer) { printSandboxes(w, sbs, wideOutput(c)) })
		},
	}
}

// parseSandboxFilters turns --filter values into one predicate (all must hold).
func parseSandboxFilters(items []string) (func(api.Sandbox) bool, error) {
	var preds []func(api.Sandbox) bool
	for _, item := range items {
		for _, f := range splitFilters(item) {
			key, val, ok := strings.Cut(f, "=")
			if !ok || val == "" {
				return nil, usagef("--filter %q: want KEY=VALUE with KEY one of label, pool, state, image", f)
			}
			switch key {
			case "pool":
				preds = append(preds, func(s api.Sandbox) bool { return s.Pool == val })
			case "state":
				preds = append(preds, func(s api.Sandbox) bool { return orDefault(s.State, api.StateLeased) == val })
			case "image":
				preds = append(preds, func(s api.Sandbox) bool { return s.Image == val })
			case "label":
				k, v, hasValue := strings.Cut(val, "=")
				preds = append(preds, func(s api.Sandbox) bool {
					got, ok := s.Labels[k]
					return ok && (!hasValue || got == v)
				})
			default:
				return nil, usagef("--filter %q: unknown key %q (want label, pool, state or image)", f, key)
			}
		}
	}
	return func(s api.Sandbox) bool {
		for _, p := range preds {
			if !p(s) {
				return false
			}
		}
		return true
	}, nil
}

// splitFilters splits "pool=p,label=a=b" at the commas that start a new KEY=.
func splitFilters(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		key, _, _ := strings.Cut(part, "=")
		switch {
		case len(out) > 0 && !isFilterKey(key):
			out[len(out)-1] += "," + part
		default:
			out = append(out, part)
		}
	}
	return out
}

func isFilterKey(k string) bool {
	switch k {
	case "label", "pool", "state", "image":
		return true
	}
	return false
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name: "inspect", Usage: "show leased sandboxes", ArgsUsage: "ID [ID...]",
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return usagef("inspect takes one or more sandbox IDs")
			}
			cl := newClient(c)
			var sbs []api.Sandbox
			for _, id := range c.Args().Slice() {
				sb, err := cl.Sandbox(c.Context, id)
				if err != nil {
					return err
				}
				sbs = append(sbs, sb)
			}
			var v any = sbs
			if len(sbs) == 1 {
				v = sbs[0]
			}
			return printResult(c, v, func(w io.Writer) {
				for i, sb := range sbs {
					if i > 0 {
						fmt.Fprintln(w)
					}
					printSandbox(w, sb)
				}
			})
		},
	}
}

func printSandboxes(w io.Writer, sbs []api.Sandbox, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	head := "ID\tPOOL\tIMAGE\tLEASED\tSTATE"
	if wide {
		head += "\tIP\tCONTAINER\tLABELS"
	}
	fmt.Fprintln(tw, head)
	for _, s := range sbs {
		state := s.State
		if s.Reason != "" {
			state += ": " + s.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\t%s", s.ID, s.Pool, s.Image, time.Since(s.LeasedAt).Round(time.Second), state)
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s", orNone(s.IP), s.Container, labelsText(s.Labels))
		}
		fmt.Fprintln(tw)
	}
}

// labelsText prints labels as K=V,K=V in key order.
func labelsText(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + labels[k]
	}
	return orNone(strings.Join(keys, ","))
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
	fmt.Fprintf(tw, "Limits:\t%s\nSeccomp:\t%s\nUser namespace:\t%s\nCapabilities:\t%s\n", limitsText(s.Limits),
		orNone(s.Isolation.Seccomp), usernsText(s.Isolation), strings.Join(s.Isolation.Capabilities, " "))
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
				Name: "destroy", Usage: "destroy quarantined sandboxes with their checkpoints and state", ArgsUsage: "ID [ID...]",
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return usagef("sandbox destroy takes one or more sandbox IDs")
					}
					cl := newClient(c)
					return forEachID(c, func(id string) (any, error) {
						return map[string]string{"destroyed": id}, cl.DestroyQuarantined(c.Context, id)
					})
				},
			},
		},
	}
}

// usernsText shows a sandbox's user namespace: its mapping, or that it has none.
func usernsText(i api.Isolation) string {
	m := i.IDMapping
	switch {
	case !i.UserNamespace:
		return "false (root in the sandbox is host root)"
	case m == nil:
		return "true"
	}
	return fmt.Sprintf("true (ids %d-%d are host ids %d-%d)", m.ContainerID, m.ContainerID+m.Size-1, m.HostID, m.HostID+m.Size-1)
}
