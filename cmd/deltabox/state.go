package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

func stateCommand() *cli.Command {
	return &cli.Command{
		Name:  "state",
		Usage: "read and patch a sandbox's agent state (a JSON document)",
		Subcommands: []*cli.Command{{
			Name: "get", Usage: "print the document, or the value at an RFC 6901 pointer", ArgsUsage: "ID [POINTER]",
			Flags:  []cli.Flag{&cli.StringFlag{Name: "at", Usage: "as of a checkpoint (ID, name, @, @~N or lease), without moving the sandbox"}},
			Action: stateGet,
		}, {
			Name: "patch", Usage: "apply RFC 6902 ops (plus append) from an argument or - for stdin; all or none",
			ArgsUsage: "ID OPS_JSON|-",
			Flags:     []cli.Flag{&cli.Int64Flag{Name: "if-seq", Value: -1, Usage: "fail with conflict if the document moved past this sequence number"}},
			Action:    statePatch,
		}, {
			Name: "log", Usage: "list logged ops with their inverses", ArgsUsage: "ID",
			Flags: []cli.Flag{
				&cli.Uint64Flag{Name: "from", Usage: "after this sequence number"},
				&cli.Uint64Flag{Name: "to", Usage: "up to this sequence number (default: now)"},
			},
			Action: stateLog,
		}},
	}
}

func stateGet(c *cli.Context) error {
	if c.NArg() < 1 || c.NArg() > 2 {
		return usagef("state get takes ID [POINTER]")
	}
	var v json.RawMessage
	var err error
	if at := c.String("at"); at != "" {
		v, err = newClient(c).StateAt(c.Context, c.Args().Get(0), at, c.Args().Get(1))
	} else {
		v, err = newClient(c).StateGet(c.Context, c.Args().Get(0), c.Args().Get(1))
	}
	if err != nil {
		return err
	}
	var pretty any
	if err := json.Unmarshal(v, &pretty); err != nil {
		return err
	}
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(pretty)
}

func statePatch(c *cli.Context) error {
	if err := exactArgs(c, 2, "ID OPS_JSON|-"); err != nil {
		return err
	}
	ops := []byte(c.Args().Get(1))
	if c.Args().Get(1) == "-" {
		var err error
		if ops, err = io.ReadAll(os.Stdin); err != nil {
			return err
		}
	}
	res, err := newClient(c).StatePatch(c.Context, c.Args().Get(0), ops, c.Int64("if-seq"))
	if err != nil {
		return err
	}
	return printResult(c, res, func(w io.Writer) { fmt.Fprintf(w, "applied %d ops, seq %d\n", res.Applied, res.Seq) })
}

func stateLog(c *cli.Context) error {
	if err := exactArgs(c, 1, "ID"); err != nil {
		return err
	}
	entries, err := newClient(c).StateLog(c.Context, c.Args().First(), c.Uint64("from"), c.Uint64("to"))
	if err != nil {
		return err
	}
	return printResult(c, entries, func(w io.Writer) {
		for _, e := range entries {
			fmt.Fprintf(w, "#%d ckpt %s %s  (inverse %s)\n", e.Seq, e.Checkpoint, e.Op, joinRaw(e.Inverse))
		}
	})
}

func joinRaw(items []json.RawMessage) string {
	data, _ := json.Marshal(items)
	return string(data)
}
