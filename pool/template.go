package pool

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// Template is a named sandbox recipe and the size of its warm pool.
type Template struct {
	Name         string            `json:"name"`
	Image        string            `json:"image"`
	CPUs         float64           `json:"cpus,omitempty"`         // CPU quota in cores (0: the node default)
	MemoryBytes  int64             `json:"memory_bytes,omitempty"` // memory limit (0: the node default)
	Pids         int64             `json:"pids,omitempty"`         // pids limit (0: the node default)
	DiskBytes    int64             `json:"disk_bytes,omitempty"`   // writable layer size (0: the node default)
	Env          []string          `json:"env,omitempty"`          // KEY=VALUE for every process
	Workdir      string            `json:"workdir,omitempty"`      // default working directory of execs
	Labels       map[string]string `json:"labels,omitempty"`
	EgressPolicy string            `json:"egress_policy,omitempty"` // policy document (YAML), used by the egress proxy
	// NoUserNamespace runs the pool's sandboxes without a user namespace: root inside is
	// host root (weaker; see docs/security.md). By default each sandbox has its own.
	NoUserNamespace bool `json:"no_user_namespace,omitempty"`
	// CheckpointProcesses is the default of a checkpoint's processes flag (keep the
	// processes as templates, docs/process-templates.md) for the pool's sandboxes.
	CheckpointProcesses bool `json:"checkpoint_processes,omitempty"`
	MinReady            int  `json:"min_ready"`
	Max                 int  `json:"max"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidateName checks that name is usable as a pool name (and as a path component).
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("pool name %q: want 1-63 of [a-z0-9_.-], starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Validate checks a template and fills defaults.
func (t *Template) Validate() error {
	if err := ValidateName(t.Name); err != nil {
		return err
	}
	if t.Image == "" {
		return fmt.Errorf("pool %q: an image is required: %w", t.Name, errdefs.ErrInvalidArgument)
	}
	if t.MinReady < 0 || t.Max < 0 {
		return fmt.Errorf("pool %q: min_ready and max must not be negative: %w", t.Name, errdefs.ErrInvalidArgument)
	}
	if err := t.limits().Validate(fmt.Sprintf("pool %q", t.Name)); err != nil {
		return err
	}
	if t.Max == 0 {
		t.Max = max(t.MinReady, 1) * 4
	}
	if t.MinReady > t.Max {
		return fmt.Errorf("pool %q: min_ready %d is above max %d: %w", t.Name, t.MinReady, t.Max, errdefs.ErrInvalidArgument)
	}
	if t.Workdir != "" && !strings.HasPrefix(t.Workdir, "/") {
		return fmt.Errorf("pool %q: workdir %q must be absolute: %w", t.Name, t.Workdir, errdefs.ErrInvalidArgument)
	}
	return ValidateEnv(t.Env)
}

// ValidateEnv checks KEY=VALUE entries.
func ValidateEnv(env []string) error {
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, "\x00") {
			return fmt.Errorf("env %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
