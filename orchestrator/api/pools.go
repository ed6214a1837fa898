package api

import (
	"time"

	"github.com/deltabox/deltabox/pool"
	"github.com/deltabox/deltabox/pool/initproto"
)

// Pool types travel as the pool package defines them.
type (
	Template    = pool.Template
	PoolInfo    = pool.PoolInfo
	Sandbox     = pool.Sandbox
	ExitStatus  = initproto.ExitStatus
	LeaseResult = pool.LeaseResult
)

// ScaleRequest is the body of POST /v1/pools/{name}/scale.
type ScaleRequest struct {
	MinReady int `json:"min_ready"`
}

// LeaseRequest is the body of POST /v1/pools/{name}/lease.
type LeaseRequest struct {
	Env          []string          `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	EgressPolicy string            `json:"egress_policy,omitempty"` // YAML; overrides the pool's
}

// Lease is the answer to a lease.
type Lease struct {
	pool.LeaseResult
	LeaseMS float64 `json:"lease_ms"`
}

// ExecRequest is the first line of the body of POST /v1/sandboxes/{id}/exec; when Stdin is
// set, the rest of the body is the command's standard input.
type ExecRequest struct {
	Argv      []string      `json:"argv"`
	Env       []string      `json:"env,omitempty"`
	Workdir   string        `json:"workdir,omitempty"`
	User      string        `json:"user,omitempty"`
	Timeout   time.Duration `json:"timeout_ns,omitempty"`
	OutputCap int64         `json:"output_cap,omitempty"`
	Stdin     bool          `json:"stdin,omitempty"`
	Tag       string        `json:"tag,omitempty"`
	Via       string        `json:"via,omitempty"` // "" (init, containerd as fallback), init, containerd
}

// ExecEvent is one JSON line of the exec response stream: output as it comes, then exactly
// one final event carrying Exit or Error.
type ExecEvent struct {
	Stdout []byte      `json:"o,omitempty"`
	Stderr []byte      `json:"e,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}
