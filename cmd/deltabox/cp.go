package main

import (
	"archive/tar"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/internal/rootfs"
)

func cpCommand() *cli.Command {
	return &cli.Command{
		Name: "cp", Usage: "copy files or directories between the host and a sandbox",
		ArgsUsage: "LOCAL ID:PATH | ID:PATH LOCAL",
		Action:    runCp,
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
	if err := exactArgs(c, 2, "SRC DST"); err != nil {
		return err
	}
	src, dst := c.Args().Get(0), c.Args().Get(1)
	sid, spath, sremote := splitRemote(src)
	did, dpath, dremote := splitRemote(dst)
	var res cpResult
	var err error
	switch {
	case sremote == dremote:
		return usagef("cp copies between the host and a sandbox: exactly one of SRC and DST must be ID:PATH")
	case dremote:
		res.Direction = "to_sandbox"
		res.ExtractResult, err = copyToSandbox(c, src, did, dpath)
	default:
		res.Direction = "from_sandbox"
		res.ExtractResult, err = copyFromSandbox(c, sid, spath, dst)
	}
	if err != nil {
		return err
	}
	return printResult(c, res, func(w io.Writer) {
		fmt.Fprintf(w, "copied %d entries, %d bytes\n", res.Entries, res.Bytes)
	})
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
	return newClient(c).CopyTo(c.Context, id, dest, pr)
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
	return root.Extract(filepath.Base(abs), tar.NewReader(body), rootfs.ExtractOptions{})
}
