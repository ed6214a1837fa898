//go:build !cli

package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/config"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: configUsage,
		Subcommands: []*cli.Command{{
			Name:  "default",
			Usage: "print the commented default configuration",
			Action: func(c *cli.Context) error {
				_, err := fmt.Fprint(c.App.Writer, config.DefaultText())
				return err
			},
		}, {
			Name:      "check",
			Usage:     "validate a configuration file",
			ArgsUsage: "FILE",
			Action: func(c *cli.Context) error {
				if err := exactArgs(c, 1, "FILE"); err != nil {
					return err
				}
				if _, err := config.Load(c.Args().First()); err != nil {
					return err
				}
				_, err := fmt.Fprintf(c.App.Writer, "%s: ok\n", c.Args().First())
				return err
			},
		}},
	}
}
