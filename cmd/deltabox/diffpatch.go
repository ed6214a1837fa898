package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// defaultIgnores are the noise `diff` leaves out unless --all: byte-code caches and git's
// object store. --ignore adds patterns (path.Match against each path component, or a path
// prefix when the pattern holds a slash).
var defaultIgnores = []string{"__pycache__", "*.pyc", ".git/objects"}

func diffFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "patch", Aliases: []string{"p"}, Usage: "unified diffs of text files (size and sha256 of binary ones)"},
		&cli.BoolFlag{Name: "stat", Usage: "lines added and removed per file"},
		&cli.BoolFlag{Name: "all", Usage: "no default ignores (" + strings.Join(defaultIgnores, ", ") + ")"},
		&cli.StringSliceFlag{Name: "ignore", Usage: "also leave out paths matching this pattern (repeatable)"},
	}
}

// diffAction is `diff ID [FROM [TO]] [PATH...]`: positional FROM and TO are checkpoint
// references (anything with a slash is a path).
func diffAction(c *cli.Context) error {
	if c.NArg() < 1 {
		return usagef("diff takes ID [FROM [TO]] [PATH...]")
	}
	args := c.Args().Slice()
	id, from, to := args[0], c.String("from"), c.String("to")
	var paths []string
	for _, a := range args[1:] {
		switch {
		case strings.Contains(a, "/"):
			paths = append(paths, a)
		case from == "":
			from = a
		case to == "":
			to = a
		default:
			return usagef("diff takes ID [FROM [TO]] [PATH...] (paths start with /): %q", a)
		}
	}
	cl := newClient(c)
	d, err := cl.Diff(c.Context, id, from, to)
	if err != nil {
		return err
	}
	d.Files = filterFiles(d.Files, paths, ignores(c))
	if !c.Bool("patch") && !c.Bool("stat") {
		return printResult(c, d, func(w io.Writer) { printDiff(w, d) })
	}
	w := c.App.Writer
	for _, f := range d.Files {
		if f.Kind != "file" {
			fmt.Fprintf(w, "%s %s (%s)\n", f.Change, f.Path, f.Kind)
			continue
		}
		a, b, err := fileVersions(c, id, d, f)
		if err != nil {
			return err
		}
		printFilePatch(w, f.Path, a, b, c.Bool("stat"))
	}
	return nil
}

// ignores returns the patterns in force.
func ignores(c *cli.Context) []string {
	out := c.StringSlice("ignore")
	if !c.Bool("all") {
		out = append(out, defaultIgnores...)
	}
	return out
}

// filterFiles keeps the changes under one of paths (all when none) and not ignored.
func filterFiles(files []api.FileChange, paths, ignore []string) []api.FileChange {
	out := []api.FileChange{}
	for _, f := range files {
		if len(paths) > 0 && !underAny(f.Path, paths) {
			continue
		}
		if !ignored(f.Path, ignore) {
			out = append(out, f)
		}
	}
	return out
}

func underAny(p string, roots []string) bool {
	for _, r := range roots {
		r = path.Clean("/" + r)
		if p == r || r == "/" || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

func ignored(p string, patterns []string) bool {
	for _, pat := range patterns {
		if strings.Contains(pat, "/") {
			if strings.Contains(p+"/", "/"+strings.Trim(pat, "/")+"/") {
				return true
			}
			continue
		}
		for _, comp := range strings.Split(strings.Trim(p, "/"), "/") {
			if ok, _ := path.Match(pat, comp); ok {
				return true
			}
		}
	}
	return false
}

// fileVersions fetches a file's content at the diff's two ends (nil where it does not exist).
func fileVersions(c *cli.Context, id string, d api.Diff, f api.FileChange) (a, b []byte, err error) {
	cl := newClient(c)
	if f.Change != "added" {
		var buf bytes.Buffer
		if _, err := cl.ShowFile(c.Context, id, d.From, f.Path, &buf); err != nil {
			return nil, nil, err
		}
		a = buf.Bytes()
	}
	if f.Change == "deleted" {
		return a, nil, nil
	}
	if d.To != "" {
		var buf bytes.Buffer
		_, err := cl.ShowFile(c.Context, id, d.To, f.Path, &buf)
		return a, buf.Bytes(), err
	}
	rc, err := cl.CopyFrom(c.Context, id, f.Path) // now: the live file, as a tar stream
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return a, []byte{}, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if h.Typeflag == tar.TypeReg {
			b, err = io.ReadAll(io.LimitReader(tr, 64<<20))
			return a, b, err
		}
	}
}

// printFilePatch prints a unified diff (text) or sizes and digests (binary), or with stat one
// summary line.
func printFilePatch(w io.Writer, p string, a, b []byte, stat bool) {
	if isBinary(a) || isBinary(b) {
		line := fmt.Sprintf("Binary %s: %s -> %s", p, describeBlob(a), describeBlob(b))
		fmt.Fprintln(w, line)
		return
	}
	ud := difflib.UnifiedDiff{A: splitLines(a), B: splitLines(b), FromFile: "a" + p, ToFile: "b" + p, Context: 3}
	if a == nil {
		ud.FromFile = "/dev/null"
	}
	if b == nil {
		ud.ToFile = "/dev/null"
	}
	text, _ := difflib.GetUnifiedDiffString(ud)
	if !stat {
		fmt.Fprint(w, text)
		return
	}
	add, del := 0, 0
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"):
		case strings.HasPrefix(l, "+"):
			add++
		case strings.HasPrefix(l, "-"):
			del++
		}
	}
	fmt.Fprintf(w, " %s | +%d -%d\n", p, add, del)
}

func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return difflib.SplitLines(string(b))
}

func isBinary(b []byte) bool {
	head := b[:min(len(b), 8000)]
	if bytes.IndexByte(head, 0) >= 0 {
		return true
	}
	for cut := 0; cut < 4 && cut < len(head); cut++ { // a character cut at the end of the head
		if utf8.Valid(head[:len(head)-cut]) {
			return false
		}
		if len(b) == len(head) {
			break
		}
	}
	return !utf8.Valid(head)
}

func describeBlob(b []byte) string {
	if b == nil {
		return "none"
	}
	return fmt.Sprintf("%d bytes sha256:%x", len(b), sha256.Sum256(b))
}
