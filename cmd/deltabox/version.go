package main

import (
	"fmt"
	"io"
	"runtime"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/version"
)

type versionResult struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Go      string `json:"go"`
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the client's version and git commit",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 0, ""); err != nil {
				return err
			}
			v := versionResult{Version: version.Version, Commit: version.Commit, Go: runtime.Version()}
			return printResult(c, v, func(w io.Writer) {
				fmt.Fprintf(w, "deltabox %s\ncommit: %s\ngo: %s\n", v.Version, v.Commit, v.Go)
			})
		},
	}
}
