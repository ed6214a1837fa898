package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/rootfs"
)

func cpCommand() *cli.Command {
	return &cli.Command{
		Name: "cp", Usage: "copy files or directories between the host and a sandbox",
		ArgsUsage: "SRC... ID:DIR | LOCAL... ID:PATH | ID:PATH... LOCAL | - ID:DIR | ID:PATH -",
		Description: "As docker cp: the sandbox's symlinks on the way are followed inside its root (never out of it);\n" +
			"several sources go into a directory; - reads a tar stream from stdin (to a sandbox) or writes\n" +
			"one to stdout (from a sandbox); -a keeps the entries' owners when extracting on the host.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "archive", Aliases: []string{"a"}, Usage: "keep uid/gid of the copied entries on the host (as root)"},
			&cli.BoolFlag{Name: "parents", Aliases: []string{"p"}, Usage: "make the destination's missing parent directories (in the sandbox, or on the host)"},
		},
		Action: runCp,
	}
}

// splitRemote splits "ID:PATH"; a first part with a slash is a local path (docker cp's rule).
func splitRemote(arg string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return id, path, true
}

type cpResult struct {
	Direction string `json:"direction"`
	rootfs.ExtractResult
}

func runCp(c *cli.Context) error {
	if c.NArg() < 2 {
		return usagef("cp takes SRC... DST, one side ID:PATH (got %d argument(s))", c.NArg())
	}
	args := c.Args().Slice()
	srcs, dst := args[:len(args)-1], args[len(args)-1]
	did, dpath, dremote := splitRemote(dst)
	var res cpResult
	for _, src := range srcs {
		sid, spath, sremote := splitRemote(src)
		var r rootfs.ExtractResult
		var err error
		switch {
		case sremote == dremote:
			return usagef("cp copies between the host and a sandbox: %s and %s cannot both be %s", src, dst, map[bool]string{true: "ID:PATH", false: "local"}[dremote])
		case dremote && src == "-":
			res.Direction = "to_sandbox"
			r, err = newClient(c).CopyToParents(c.Context, did, dpath, os.Stdin, c.Bool("parents"))
		case dremote:
			res.Direction = "to_sandbox"
			r, err = copyToSandbox(c, src, did, dpath)
		case dst == "-":
			if len(srcs) > 1 {
				return usagef("cp to - streams one source as a tar (got %d)", len(srcs))
			}
			return copyTarOut(c, sid, spath)
		default:
			res.Direction = "from_sandbox"
			if len(srcs) > 1 {
				if err := os.MkdirAll(dst, 0o755); err != nil {
					return err
				}
			} else if c.Bool("parents") {
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return err
				}
			}
			r, err = copyFromSandbox(c, sid, spath, dst)
		}
		if err != nil {
			return fmt.Errorf("cp %s %s: %w", src, dst, err)
		}
		res.Entries += r.Entries
		res.Bytes += r.Bytes
	}
	return printResult(c, res, func(w io.Writer) {
		fmt.Fprintf(w, "copied %d entries, %d bytes\n", res.Entries, res.Bytes)
	})
}

// copyTarOut writes src of the sandbox to stdout as the daemon's tar stream.
func copyTarOut(c *cli.Context, id, src string) error {
	body, err := newClient(c).CopyFrom(c.Context, id, src)
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = io.Copy(c.App.Writer, body)
	return err
}

func copyToSandbox(c *cli.Context, local, id, dest string) (rootfs.ExtractResult, error) {
	abs, err := filepath.Abs(local)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	root, err := rootfs.Open(filepath.Dir(abs))
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	defer root.Close()
	if _, err := root.Lstat(filepath.Base(abs)); err != nil {
		return rootfs.ExtractResult{}, fmt.Errorf("local %s: %w", local, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(root.Archive(filepath.Base(abs), pw)) }()
	defer pr.Close()
	return newClient(c).CopyToParents(c.Context, id, dest, pr, c.Bool("parents"))
}

// copyFromSandbox extracts the sandbox's tar stream locally with the same symlink-safe code
// the daemon uses: the stream's content is the sandbox's, hence hostile.
func copyFromSandbox(c *cli.Context, id, src, local string) (rootfs.ExtractResult, error) {
	abs, err := filepath.Abs(local)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	body, err := newClient(c).CopyFrom(c.Context, id, src)
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	defer body.Close()
	root, err := rootfs.Open(filepath.Dir(abs))
	if err != nil {
		return rootfs.ExtractResult{}, err
	}
	defer root.Close()
	return root.Extract(filepath.Base(abs), tar.NewReader(body), rootfs.ExtractOptions{Chown: c.Bool("archive")})
}
