package criu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ConfigAnnotation is the OCI annotation runc reads to find a container's CRIU configuration
// file; without it runc uses /etc/criu/runc.conf. runc passes the file to CRIU on both dump and
// restore, and CRIU lets the file override the options runc sent over RPC.
const ConfigAnnotation = "org.criu.config"

// Options are the CRIU options containerd's runc shim does not forward on restore (and only
// partly on dump). They reach CRIU through a configuration file named by ConfigAnnotation.
type Options struct {
	// TCPEstablished checkpoints and restores established TCP connections. Only for in-place
	// restores that keep the sandbox's IP address; never for clones.
	TCPEstablished bool
	// TCPClose restores established TCP connections closed (the peer sees a reset). Use it
	// for restores under a new identity (another container ID, another node, another IP).
	TCPClose bool
	// FileLocks checkpoints and restores flock/POSIX locks. Without it CRIU refuses to dump
	// a process that holds a lock.
	FileLocks bool
	// ExtUnixSockets lets CRIU dump unix sockets connected to a peer outside the sandbox.
	// Such a connection is restored broken; prefer closing host connections before a dump.
	ExtUnixSockets bool
	// SkipInFlight drops TCP connections that are half-open (SYN received) at dump time.
	SkipInFlight bool
	// LinkRemap lets CRIU dump open files that were unlinked (or have no name) by linking
	// them back to a temporary name.
	LinkRemap bool
	// CgroupYard is a directory of the node's cgroup hierarchies already mounted
	// (PrepareCgroupYard), which CRIU uses instead of mounting each hierarchy itself: a fresh
	// cgroup2 mount resets the node's cgroup2 flags.
	CgroupYard string
	// Extra holds further CRIU long options, one per entry, without the leading "--"
	// (e.g. "ghost-limit 10M"). "network-lock" is refused: CRIU 4.1.1 segfaults in RPC mode
	// (the way runc drives it) when a configuration file sets it.
	Extra []string
}

// Validate refuses contradicting options.
func (o Options) Validate() error {
	if o.TCPEstablished && o.TCPClose {
		return fmt.Errorf("criu options: tcp-established and tcp-close exclude each other: %w", errdefs.ErrInvalidArgument)
	}
	if o.CgroupYard != "" && (!filepath.IsAbs(o.CgroupYard) || strings.ContainsAny(o.CgroupYard, " \t\n\r\"'\\")) {
		return fmt.Errorf("criu options: cgroup yard %q must be an absolute path without blanks or quotes (CRIU's configuration file splits on them): %w", o.CgroupYard, errdefs.ErrInvalidArgument)
	}
	for _, e := range o.Extra {
		if e == "" || strings.ContainsAny(e, "\n\r") || strings.HasPrefix(e, "-") {
			return fmt.Errorf("criu options: bad extra option %q (one option per entry, no leading dashes): %w", e, errdefs.ErrInvalidArgument)
		}
		if strings.HasPrefix(e, "network-lock") {
			return fmt.Errorf("criu options: %q in a config file crashes CRIU 4.1.1 under runc: %w", e, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Render returns the options in CRIU's configuration file syntax: one long option per line.
func (o Options) Render() []byte {
	var b strings.Builder
	b.WriteString("# written by deltabox (criu.WriteConfig)\n")
	flags := []struct {
		on   bool
		name string
	}{
		{o.TCPEstablished, "tcp-established"}, {o.TCPClose, "tcp-close"}, {o.FileLocks, "file-locks"},
		{o.ExtUnixSockets, "ext-unix-sk"}, {o.SkipInFlight, "skip-in-flight"}, {o.LinkRemap, "link-remap"},
	}
	for _, f := range flags {
		if f.on {
			b.WriteString(f.name + "\n")
		}
	}
	if o.CgroupYard != "" {
		b.WriteString("cgroup-yard " + o.CgroupYard + "\n")
	}
	for _, e := range o.Extra {
		b.WriteString(e + "\n")
	}
	return []byte(b.String())
}

// WriteConfig writes o as a CRIU configuration file at path, atomically (temp file, fsync,
// rename). CRIU silently ignores a missing file, so write it before the container's first dump
// or restore and keep it as long as the container exists.
func WriteConfig(path string, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("criu config path %q must be absolute: %w", path, errdefs.ErrInvalidArgument)
	}
	return writeFileAtomic(path, o.Render(), 0o644)
}

// WithConfig sets the ConfigAnnotation on a container's spec at creation time, so runc hands
// the CRIU configuration file at path to every dump and restore of that container. runc reads
// the annotation from the spec of the task being restored: a container created for a restore
// must carry it before NewTask.
func WithConfig(path string) oci.SpecOpts {
	return oci.WithAnnotations(map[string]string{ConfigAnnotation: path})
}

// WithoutConfig sets the annotation to the empty string, which makes runc pass no
// configuration file at all (not even /etc/criu/runc.conf).
func WithoutConfig() oci.SpecOpts {
	return oci.WithAnnotations(map[string]string{ConfigAnnotation: ""})
}

// DefaultRuncConfig is the CRIU configuration file runc uses for containers without the
// ConfigAnnotation.
const DefaultRuncConfig = "/etc/criu/runc.conf"

// ConfigOf returns the CRIU configuration file runc uses for a container: the one its
// ConfigAnnotation names, DefaultRuncConfig without the annotation, "" when the annotation
// is set empty (no file at all).
func ConfigOf(ctx context.Context, c containerd.Container) (string, error) {
	s, err := c.Spec(ctx)
	if err != nil {
		return "", fmt.Errorf("spec of container %s: %w", c.ID(), err)
	}
	return configOfSpec(s), nil
}

// configOfSpec is ConfigOf for a spec at hand.
func configOfSpec(s *specs.Spec) string {
	p, ok := s.Annotations[ConfigAnnotation]
	if !ok {
		return DefaultRuncConfig
	}
	return p
}

// SetConfig points an existing container at the CRIU configuration file path (for example
// before restoring it in place with other options than it was created with). It must not have
// a task: runc reads the annotation when the task is created.
func SetConfig(ctx context.Context, c containerd.Container, path string) error {
	s, err := c.Spec(ctx)
	if err != nil {
		return fmt.Errorf("spec of container %s: %w", c.ID(), err)
	}
	if err := c.Update(ctx, containerd.UpdateContainerOpts(containerd.WithSpec(s, WithConfig(path)))); err != nil {
		return fmt.Errorf("set criu config of container %s: %w", c.ID(), err)
	}
	return nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s: %w", path, err)
	}
	return nil
}
