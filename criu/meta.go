package criu

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// MetaFile is the name of the metadata file Dump writes into an images directory and Pack
// stores first in the archive.
const MetaFile = "deltabox-meta.json"

// Meta describes where and by what a set of CRIU images was made; restores check it with
// CheckCompatible before handing the images to CRIU.
type Meta struct {
	CRIUVersion int       `json:"criuVersion"` // go-criu encoding, 40101 = 4.1.1
	Kernel      string    `json:"kernel"`      // uname -r of the dumping host
	Arch        string    `json:"arch"`        // GOARCH of the dumping host
	PageSize    int       `json:"pageSize"`
	Created     time.Time `json:"created"`
	ContainerID string    `json:"containerID,omitempty"` // container the images were dumped from
	CgroupsPath string    `json:"cgroupsPath,omitempty"` // its spec's cgroupsPath
	// Set by Pack: what the archive unpacks to (bytes of file content, files and
	// directories). Restores bound Unpack by them (WithLimits).
	UnpackedBytes int64 `json:"unpackedBytes,omitempty"`
	Entries       int   `json:"entries,omitempty"`
	// LoopbackTCPOnly: every TCP connection of the dumped processes ran over loopback (or
	// there were none), so a restore under a new identity can keep them established. Images
	// without it (older ones) are restored with tcp-close.
	LoopbackTCPOnly bool `json:"loopbackTCPOnly,omitempty"`
}

// NewIdentityOptions are the CRIU options for restoring images described by m under a new
// identity (another container, node or IP address): established TCP connections are kept
// when all of them ran over loopback inside the sandbox, and closed otherwise (a peer
// outside cannot follow the sandbox to its new address). File locks are restored.
func NewIdentityOptions(m Meta) Options {
	return Options{TCPEstablished: m.LoopbackTCPOnly, TCPClose: !m.LoopbackTCPOnly, FileLocks: true}
}

// LocalMeta describes images dumped now on this host by the CRIU that st describes.
func LocalMeta(st Status) Meta {
	return Meta{
		CRIUVersion: st.Version,
		Kernel:      kernelRelease(),
		Arch:        runtime.GOARCH,
		PageSize:    os.Getpagesize(),
		Created:     time.Now().UTC(),
	}
}

// ReadMeta reads the metadata Dump or Unpack left in an images directory.
func ReadMeta(dir string) (Meta, error) {
	var m Meta
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("no %s in %s: %w", MetaFile, dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return m, fmt.Errorf("read criu image metadata: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("decode %s: %v: %w", filepath.Join(dir, MetaFile), err, errdefs.ErrInvalidArgument)
	}
	return m, nil
}

// WriteMeta writes m into an images directory, atomically.
func WriteMeta(dir string, m Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode criu image metadata: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, MetaFile), append(b, '\n'), 0o644)
}

// CheckCompatible refuses images local cannot restore: CRIU unusable here, images from a
// newer CRIU (image formats only grow), another architecture or another page size. A
// different kernel is allowed (CRIU checks the features it needs at restore). Errors are
// errdefs.ErrFailedPrecondition and name the reason.
func CheckCompatible(meta Meta, local Status) error {
	switch {
	case !local.Available:
		return fmt.Errorf("criu images cannot be restored here: CRIU unusable: %s: %w", local.Reason, errdefs.ErrFailedPrecondition)
	case meta.CRIUVersion <= 0:
		return fmt.Errorf("criu images carry no CRIU version: %w", errdefs.ErrFailedPrecondition)
	case meta.CRIUVersion > local.Version:
		return fmt.Errorf("criu images were made by CRIU %s, newer than the local CRIU %s: %w",
			Status{Version: meta.CRIUVersion}.VersionString(), local.VersionString(), errdefs.ErrFailedPrecondition)
	case meta.Arch != runtime.GOARCH:
		return fmt.Errorf("criu images were made on architecture %q, this node is %q: %w", meta.Arch, runtime.GOARCH, errdefs.ErrFailedPrecondition)
	case meta.PageSize != os.Getpagesize():
		return fmt.Errorf("criu images were made with page size %d, this node uses %d: %w", meta.PageSize, os.Getpagesize(), errdefs.ErrFailedPrecondition)
	}
	return nil
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return strings.TrimRight(string(u.Release[:]), "\x00")
}
