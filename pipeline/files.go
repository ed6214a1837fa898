package pipeline

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"time"
)

// maxFileSize bounds a file the pipeline copies into every sandbox (it is held in memory).
const maxFileSize = 16 << 20

// File is a host file copied into every task's sandbox right after the lease, before the
// first checkpoint: `files: [{src: agent.py, dest: /usr/local/bin/agent.py, mode: 0755}]`.
// A relative src is relative to the pipeline file; dest's parent must exist in the image.
type File struct {
	Src  string `yaml:"src"`
	Dest string `yaml:"dest"`
	Mode uint32 `yaml:"mode"` // default 0644

	data []byte
}

// loadFiles reads every file so that a missing one fails the run before anything is leased.
func (p *Pipeline) loadFiles(line int) error {
	for i := range p.Files {
		f := &p.Files[i]
		if f.Src == "" || !path.IsAbs(f.Dest) || path.Clean(f.Dest) == "/" {
			return lineErrorf(line, "files[%d]: want src and an absolute dest below /", i)
		}
		if p.readFile != nil { // a bundle: the files travelled with the pipeline
			var err error
			if f.data, err = p.readFile(f.Src); err != nil {
				return lineErrorf(line, "files[%d]: %v", i, err)
			}
		} else if err := f.load(p.Source, i, line); err != nil {
			return err
		}
		if f.Mode == 0 {
			f.Mode = 0o644
		}
	}
	return nil
}

// load reads f.Src (relative to the pipeline file at source).
func (f *File) load(source string, i, line int) error {
	src := f.Src
	if !filepath.IsAbs(src) {
		src = filepath.Join(filepath.Dir(source), src)
	}
	st, err := os.Stat(src)
	if err != nil || !st.Mode().IsRegular() || st.Size() > maxFileSize {
		return lineErrorf(line, "files[%d]: %s: want a regular file of at most %d bytes (%v)", i, src, maxFileSize, err)
	}
	if f.data, err = os.ReadFile(src); err != nil {
		return lineErrorf(line, "files[%d]: %v", i, err)
	}
	return nil
}

// tarball is a tar stream holding only f, named after dest's base name.
func (f *File) tarball() ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdr := &tar.Header{Name: path.Base(f.Dest), Mode: int64(f.Mode & 0o7777), Size: int64(len(f.data)),
		Typeflag: tar.TypeReg, ModTime: time.Now()}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(f.data); err != nil {
		return nil, err
	}
	return b.Bytes(), tw.Close()
}

// copyFiles puts the pipeline's files into the task's sandbox.
func (tr *taskRun) copyFiles(ctx context.Context) error {
	for i := range tr.r.p.Files {
		f := &tr.r.p.Files[i]
		tb, err := f.tarball()
		if err != nil {
			return err
		}
		if _, err := tr.r.c.CopyTo(ctx, tr.sb, f.Dest, bytes.NewReader(tb)); err != nil {
			return fmt.Errorf("copy %s to %s: %w", f.Src, f.Dest, err)
		}
	}
	return nil
}
