// Package config reads the daemon's TOML configuration file. Only the daemon wiring in
// cmd/deltabox uses it: it turns a Config into constructor options, so that library
// packages never read TOML. Unknown keys are an error that names the key.
package config

import (
	_ "embed"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
)

// CurrentVersion is the config schema version this build understands.
const CurrentVersion = 1

// Config is the daemon configuration. Every field is documented in default.toml, which
// `deltabox config default` prints.
type Config struct {
	Version     int         `toml:"version"`
	Root        string      `toml:"root"`
	Address     string      `toml:"address"`
	SocketGroup string      `toml:"socket_group"`
	Containerd  Containerd  `toml:"containerd"`
	Log         Log         `toml:"log"`
	CRIU        CRIU        `toml:"criu"`
	ObjectStore ObjectStore `toml:"object_store"`
	Metrics     Metrics     `toml:"metrics"`
	Checkpoints Checkpoints `toml:"checkpoints"`
	Network     Network     `toml:"network"`
	Egress      Egress      `toml:"egress"`
	Snapshots   Snapshots   `toml:"snapshots"`
	Sandbox     Sandbox     `toml:"sandbox"`
	E2B         E2B         `toml:"e2b"`
	API         API         `toml:"api"`
	Temporal    Temporal    `toml:"temporal"`
}

// API configures the host API's TCP listener for remote clients (the unix socket stays).
type API struct {
	TCPAddress   string `toml:"tcp_address"`
	TokensFile   string `toml:"tokens_file"`
	TLSCertFile  string `toml:"tls_cert_file"`
	TLSKeyFile   string `toml:"tls_key_file"`
	ClientCAFile string `toml:"client_ca_file"`
}

func (a API) validate(name string) error {
	if a.TCPAddress == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(a.TCPAddress); err != nil {
		return fmt.Errorf("config %s: api.tcp_address %q: want host:port: %w", name, a.TCPAddress, errdefs.ErrInvalidArgument)
	}
	if a.TokensFile == "" {
		return fmt.Errorf("config %s: api.tcp_address is set but api.tokens_file is not (the TCP API always asks for a token): %w", name, errdefs.ErrInvalidArgument)
	}
	if (a.TLSCertFile == "") != (a.TLSKeyFile == "") {
		return fmt.Errorf("config %s: api.tls_cert_file and api.tls_key_file go together: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Sandbox holds the limits of sandboxes whose pool sets none. Sizes are strings such as
// "1g"; 0 or "0" is unlimited.
type Sandbox struct {
	CPUs   float64 `toml:"cpus"`
	Memory string  `toml:"memory"`
	Pids   int64   `toml:"pids"`
	Disk   string  `toml:"disk"`
}

// MemoryBytes returns sandbox.memory in bytes (0: unlimited).
func (s Sandbox) MemoryBytes() (int64, error) { return parseSize("sandbox.memory", s.Memory) }

// DiskBytes returns sandbox.disk in bytes (0: unlimited).
func (s Sandbox) DiskBytes() (int64, error) { return parseSize("sandbox.disk", s.Disk) }

func parseSize(key, v string) (int64, error) {
	if v == "" || v == "0" {
		return 0, nil
	}
	n, err := units.RAMInBytes(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s = %q: want a size such as 512m or 10g, or 0 for unlimited: %w", key, v, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

func (s Sandbox) validate() error {
	if _, err := s.MemoryBytes(); err != nil {
		return err
	}
	if _, err := s.DiskBytes(); err != nil {
		return err
	}
	if s.CPUs < 0 || s.Pids < 0 {
		return fmt.Errorf("sandbox.cpus = %v, sandbox.pids = %d: must not be negative: %w", s.CPUs, s.Pids, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Temporal configures the node's Temporal worker (pipelines spread over many nodes); off
// while Address is empty.
type Temporal struct {
	Address       string   `toml:"address"`
	Namespace     string   `toml:"namespace"`
	TaskQueues    []string `toml:"task_queues"`
	MaxTasks      int      `toml:"max_tasks"`
	TLS           bool     `toml:"tls"`
	TLSCAFile     string   `toml:"tls_ca_file"`
	TLSCertFile   string   `toml:"tls_cert_file"`
	TLSKeyFile    string   `toml:"tls_key_file"`
	TLSServerName string   `toml:"tls_server_name"`
}

func (t Temporal) validate(name string) error {
	if t.Address == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(t.Address); err != nil {
		return fmt.Errorf("config %s: temporal.address %q: want HOST:PORT: %w", name, t.Address, errdefs.ErrInvalidArgument)
	}
	if t.MaxTasks < 1 {
		return fmt.Errorf("config %s: temporal.max_tasks = %d: want at least 1: %w", name, t.MaxTasks, errdefs.ErrInvalidArgument)
	}
	for _, q := range t.TaskQueues {
		if strings.TrimSpace(q) == "" {
			return fmt.Errorf("config %s: temporal.task_queues has an empty name: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	if !t.TLS && (t.TLSCAFile != "" || t.TLSCertFile != "" || t.TLSKeyFile != "") {
		return fmt.Errorf("config %s: temporal.tls_* files are set but tls = false: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Snapshots configures the signing and trust of L3 snapshots.
type Snapshots struct {
	SigningKey     string   `toml:"signing_key"`
	TrustedKeys    []string `toml:"trusted_keys"`
	RestoreTimeout Duration `toml:"restore_timeout"`
	DumpTimeout    Duration `toml:"dump_timeout"`
	LazyRestore    bool     `toml:"lazy_restore"`
	// RestoreMemory bounds the tmpfs restores stage the snapshots they download on (a size
	// such as 1g; "": 1 GiB; "0": staging on disk only).
	RestoreMemory string `toml:"restore_memory"`
}

// RestoreMemoryBytes returns snapshots.restore_memory in bytes: 0 for the default, -1 for
// none (staging on disk only).
func (s Snapshots) RestoreMemoryBytes() (int64, error) {
	if strings.TrimSpace(s.RestoreMemory) == "0" {
		return -1, nil
	}
	return parseSize("snapshots.restore_memory", s.RestoreMemory)
}

// Duration is a time.Duration written as a Go duration string ("90s", "2m").
type Duration struct{ time.Duration }

// UnmarshalText parses a duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want e.g. 90s or 2m", b)
	}
	d.Duration = v
	return nil
}

// MarshalText formats the duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Egress configures the egress proxy.
type Egress struct {
	UpstreamCAFile   string   `toml:"upstream_ca_file"`
	BodyLimit        int64    `toml:"body_limit"`
	CommitAttempts   int      `toml:"commit_attempts"`
	CommitTimeout    Duration `toml:"commit_timeout"`
	CommitBackoff    Duration `toml:"commit_backoff"`
	CommitBackoffMax Duration `toml:"commit_backoff_max"`
	MaxConnections   int      `toml:"max_connections"`
	HeaderTimeout    Duration `toml:"header_timeout"`
	BodyTimeout      Duration `toml:"body_timeout"`
	IdleTimeout      Duration `toml:"idle_timeout"`
}

// validate checks the [egress] section.
func (e Egress) validate(name string) error {
	if e.CommitAttempts < 1 || e.MaxConnections < 1 {
		return fmt.Errorf("config %s: egress.commit_attempts = %d, egress.max_connections = %d: want at least 1: %w",
			name, e.CommitAttempts, e.MaxConnections, errdefs.ErrInvalidArgument)
	}
	for key, d := range map[string]Duration{"commit_timeout": e.CommitTimeout, "commit_backoff": e.CommitBackoff,
		"commit_backoff_max": e.CommitBackoffMax, "header_timeout": e.HeaderTimeout, "body_timeout": e.BodyTimeout, "idle_timeout": e.IdleTimeout} {
		if d.Duration < time.Millisecond {
			return fmt.Errorf("config %s: egress.%s = %s: want at least 1ms: %w", name, key, d, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Network configures sandbox networking and the egress proxy's ports.
type Network struct {
	Enabled              bool   `toml:"enabled"`
	Name                 string `toml:"name"`
	Bridge               string `toml:"bridge"`
	Subnet               string `toml:"subnet"`
	ProxyPort            uint16 `toml:"proxy_port"`
	TransparentHTTPPort  uint16 `toml:"transparent_http_port"`
	TransparentHTTPSPort uint16 `toml:"transparent_https_port"`
}

// Checkpoints configures step checkpoints.
type Checkpoints struct {
	Retain       int `toml:"retain"`
	RetainBranch int `toml:"retain_branch"` // per path from the first checkpoint to a tip (0: retain)
	// StepRecords bounds the exec records kept per sandbox (0: 2000; -1: none recorded) and
	// StepOutputBytes the first and last bytes of each output stream a record keeps (0: 2048).
	StepRecords     int  `toml:"step_records"`
	StepOutputBytes int  `toml:"step_output_bytes"`
	L2Every         int  `toml:"l2_every"`
	TrackChanges    bool `toml:"track_changes"`
	// FavorDynMods reconfigures the node's cgroup2 hierarchy with favordynmods at start
	// (pool.FavorDynMods): moving a process between cgroups no longer waits for an RCU grace
	// period.
	FavorDynMods bool `toml:"favor_dynmods"`
	// TemplateMemory bounds the memory process templates hold alone, on the node and per
	// sandbox (sizes such as 2g; "" or 0: unbounded). Beyond it the oldest checkpoints'
	// templates are dropped.
	TemplateMemory        string `toml:"template_memory"`
	TemplateMemorySandbox string `toml:"template_memory_sandbox"`
	// TemplateCheckpoints bounds how many checkpoints of a sandbox keep process templates
	// (0: as many as retention keeps). Beyond it the templates of the checkpoint used least
	// recently (taken or rolled back to) are dropped.
	TemplateCheckpoints int `toml:"template_checkpoints"`
	// HugePagesBudget bounds, per checkpoint, the time spent collapsing the memory of
	// processes about to get their first template into huge pages (a duration; "0": never).
	HugePagesBudget string `toml:"huge_pages_budget"`
	// ForkLayerMemory bounds the tmpfs that holds the shared layers of `fork --from` in
	// memory (a size such as 1g; "": 1 GiB; "0": layers on disk only).
	ForkLayerMemory string `toml:"fork_layer_memory"`
}

// ForkLayerMemoryBytes returns checkpoints.fork_layer_memory in bytes: 0 for the default, -1
// for none (layers on disk only).
func (c Checkpoints) ForkLayerMemoryBytes() (int64, error) {
	if strings.TrimSpace(c.ForkLayerMemory) == "0" {
		return -1, nil
	}
	return parseSize("checkpoints.fork_layer_memory", c.ForkLayerMemory)
}

// HugePagesBudgetDuration returns checkpoints.huge_pages_budget (0: never).
func (c Checkpoints) HugePagesBudgetDuration() (time.Duration, error) {
	v := strings.TrimSpace(c.HugePagesBudget)
	if v == "" || v == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("checkpoints.huge_pages_budget %q: want a duration such as 250ms, or \"0\" for never: %w", v, errdefs.ErrInvalidArgument)
	}
	return d, nil
}

// TemplateMemoryBytes returns checkpoints.template_memory and template_memory_sandbox in
// bytes (0: unbounded).
func (c Checkpoints) TemplateMemoryBytes() (node, sandbox int64, err error) {
	if node, err = parseSize("checkpoints.template_memory", c.TemplateMemory); err != nil {
		return 0, 0, err
	}
	sandbox, err = parseSize("checkpoints.template_memory_sandbox", c.TemplateMemorySandbox)
	return node, sandbox, err
}

// Containerd says which containerd to use.
type Containerd struct {
	Address   string `toml:"address"`
	Namespace string `toml:"namespace"`
}

// Log configures log/slog output.
type Log struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

// CRIU configures process checkpoints.
type CRIU struct {
	Path string `toml:"path"`
}

// ObjectStore says where L3 snapshots are stored.
type ObjectStore struct {
	URI string `toml:"uri"`
}

// E2B configures the E2B-compatible API.
type E2B struct {
	Address        string   `toml:"address"`
	APIKeysFile    string   `toml:"api_keys_file"`
	TLSCertFile    string   `toml:"tls_cert_file"`
	TLSKeyFile     string   `toml:"tls_key_file"`
	DefaultTimeout Duration `toml:"default_timeout"`
	MaxTimeout     Duration `toml:"max_timeout"`
}

func (e E2B) validate(name string) error {
	if e.Address == "" {
		return nil
	}
	if e.APIKeysFile == "" {
		return fmt.Errorf("config %s: e2b.address is set but e2b.api_keys_file is not: %w", name, errdefs.ErrInvalidArgument)
	}
	if (e.TLSCertFile == "") != (e.TLSKeyFile == "") {
		return fmt.Errorf("config %s: e2b.tls_cert_file and e2b.tls_key_file go together: %w", name, errdefs.ErrInvalidArgument)
	}
	if e.TLSCertFile == "" && !loopback(e.Address) {
		return fmt.Errorf("config %s: e2b.address %q is not a loopback address: set e2b.tls_cert_file and e2b.tls_key_file: %w", name, e.Address, errdefs.ErrInvalidArgument)
	}
	if e.DefaultTimeout.Duration <= 0 || e.MaxTimeout.Duration < e.DefaultTimeout.Duration {
		return fmt.Errorf("config %s: e2b timeouts: want 0 < default_timeout <= max_timeout: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// loopback reports whether a host:port listens on a loopback address only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Address string `toml:"address"`
}

//go:embed default.toml
var defaultTOML string

// DefaultText returns the commented default configuration.
func DefaultText() string { return defaultTOML }

// Default returns the default configuration: default.toml is the only place defaults live.
func Default() Config {
	c, err := decode([]byte(defaultTOML), "built-in default.toml", Config{})
	if err != nil {
		panic(fmt.Sprintf("built-in default config is invalid: %v", err))
	}
	return c
}

// Load reads and validates the config file at path on top of the defaults.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

// Parse decodes TOML config text named name on top of the defaults; the text must say its
// version.
func Parse(data []byte, name string) (Config, error) {
	base := Default()
	base.Version = 0
	return decode(data, name, base)
}

// decode decodes TOML text named name over c and validates the result.
func decode(data []byte, name string, c Config) (Config, error) {
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		keys := make([]string, len(undecoded))
		for i, k := range undecoded {
			keys[i] = k.String()
		}
		return Config{}, fmt.Errorf("config %s: unknown key %q: %w", name, strings.Join(keys, `", "`), errdefs.ErrInvalidArgument)
	}
	return c, c.validate(name)
}

func (c Config) validate(name string) error {
	if c.Version != CurrentVersion {
		return fmt.Errorf("config %s: version = %d is not supported (want version = %d): %w",
			name, c.Version, CurrentVersion, errdefs.ErrInvalidArgument)
	}
	if c.Checkpoints.StepRecords < -1 || c.Checkpoints.StepOutputBytes < 0 || c.Checkpoints.StepOutputBytes > 1<<20 {
		return fmt.Errorf("config %s: checkpoints.step_records = %d, step_output_bytes = %d: want -1 or more, and 0 to 1 MiB: %w",
			name, c.Checkpoints.StepRecords, c.Checkpoints.StepOutputBytes, errdefs.ErrInvalidArgument)
	}
	if _, err := c.Checkpoints.ForkLayerMemoryBytes(); err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	if _, err := c.Snapshots.RestoreMemoryBytes(); err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	if c.Checkpoints.RetainBranch < 0 {
		return fmt.Errorf("config %s: checkpoints.retain_branch = %d: want 0 (as retain) or more: %w", name, c.Checkpoints.RetainBranch, errdefs.ErrInvalidArgument)
	}
	if c.Checkpoints.Retain < 2 {
		return fmt.Errorf("config %s: checkpoints.retain = %d: keep at least 2: %w", name, c.Checkpoints.Retain, errdefs.ErrInvalidArgument)
	}
	if c.Checkpoints.TemplateCheckpoints < 0 {
		return fmt.Errorf("config %s: checkpoints.template_checkpoints = %d: want 0 (as retain) or more: %w", name, c.Checkpoints.TemplateCheckpoints, errdefs.ErrInvalidArgument)
	}
	if _, _, err := c.Checkpoints.TemplateMemoryBytes(); err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	if _, err := c.Checkpoints.HugePagesBudgetDuration(); err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	if err := c.Egress.validate(name); err != nil {
		return err
	}
	if c.Snapshots.RestoreTimeout.Duration < time.Second {
		return fmt.Errorf("config %s: snapshots.restore_timeout = %s: want at least 1s: %w", name, c.Snapshots.RestoreTimeout, errdefs.ErrInvalidArgument)
	}
	if c.Snapshots.DumpTimeout.Duration < time.Second {
		return fmt.Errorf("config %s: snapshots.dump_timeout = %s: want at least 1s: %w", name, c.Snapshots.DumpTimeout, errdefs.ErrInvalidArgument)
	}
	if err := c.E2B.validate(name); err != nil {
		return err
	}
	if err := c.API.validate(name); err != nil {
		return err
	}
	if err := c.Temporal.validate(name); err != nil {
		return err
	}
	if err := c.Sandbox.validate(); err != nil {
		return fmt.Errorf("config %s: %w", name, err)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return fmt.Errorf("config %s: log.format %q: want text or json: %w", name, c.Log.Format, errdefs.ErrInvalidArgument)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("config %s: log.level %q: want debug, info, warn or error: %w", name, c.Log.Level, errdefs.ErrInvalidArgument)
	}
	return nil
}
