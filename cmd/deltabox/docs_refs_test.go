package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// repoFiles returns the repository's text files that docs and comments live in.
func repoFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sh", ".toml", ".py", ".yaml", ".yml":
			out = append(out, path)
		}
		if d.Name() == "Makefile" {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDocsCiteOnlyTheRepository: what docs and comments cite must ship with the code, so no
// reference to a design document outside the repository (docs/design.md holds it).
func TestDocsCiteOnlyTheRepository(t *testing.T) {
	outside := regexp.MustCompile(`shared/DESIGN|\bDESIGN\.md`)
	for _, path := range repoFiles(t) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if outside.MatchString(line) && !strings.HasSuffix(path, "docs_refs_test.go") {
				t.Errorf("%s:%d cites a document outside the repository: %s", path, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// TestDocsLinksResolve: every relative link of the markdown files names a file that exists.
func TestDocsLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, path := range repoFiles(t) {
		if filepath.Ext(path) != ".md" {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", path, m[1])
			}
		}
	}
}
