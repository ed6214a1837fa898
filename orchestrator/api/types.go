// Package api defines the wire types of DeltaBox's HTTP/JSON API (served on a unix socket,
// versioned under /v1/) and the mapping between internal error classes and the stable error
// codes (docs/api.md). It has no behaviour and imports nothing of the daemon: the orchestrator
// converts its own types to these and serves them, and orchestrator/client speaks them.
package api

// Version is the path prefix of this API.
const Version = "/v1"

// Info describes the daemon, its dependencies and the host (GET /v1/info).
type Info struct {
	// Node is this daemon's ID (<root>/node-id): pipeline results on Temporal name it.
	Node       string      `json:"node"`
	Daemon     Component   `json:"daemon"`
	Containerd Containerd  `json:"containerd"`
	Runc       Component   `json:"runc"`
	CRIU       CRIU        `json:"criu"`
	Host       Host        `json:"host"`
	StateRoot  string      `json:"state_root"`
	Namespace  string      `json:"namespace"`
	Store      ObjectStore `json:"object_store"`
	// Sandbox is the isolation every sandbox gets and the limits of those whose pool sets none.
	Sandbox   SandboxDefaults `json:"sandbox"`
	Snapshots SnapshotTrust   `json:"snapshots"`
	// Network is the sandbox network: where sandboxes reach the host and the egress proxy
	// (absent when sandboxes have loopback only).
	Network *Network `json:"network,omitempty"`
	// RemoteAPI is the host API's TCP listener (absent when [api] tcp_address is not set).
	RemoteAPI *RemoteAPI `json:"remote_api,omitempty"`
}

// RemoteAPI is the TCP listener of the host API: what a remote client needs to trust it.
type RemoteAPI struct {
	Address string `json:"address"`
	// TLSFingerprint is the SHA-256 of the server certificate, colon-separated hex.
	TLSFingerprint string `json:"tls_fingerprint_sha256"`
	// Certificate is the PEM file of the server certificate (clients' CA file when self-signed).
	Certificate string `json:"certificate"`
	// ClientCertificates says whether clients must present a certificate (mTLS).
	ClientCertificates bool `json:"client_certificates"`
}

// Network is the sandbox network as sandboxes see it.
type Network struct {
	Subnet  string `json:"subnet"`
	Gateway string `json:"gateway"` // the host's address on the sandbox network
	// Proxy is the egress proxy every sandbox's HTTP_PROXY/HTTPS_PROXY names.
	Proxy string `json:"proxy"`
}

// SnapshotTrust is the key this node signs snapshot manifests with and the keys whose
// snapshots it restores (fingerprints, "SHA256:..."; its own included).
type SnapshotTrust struct {
	SigningKey string   `json:"signing_key"`
	PublicKey  string   `json:"public_key"` // inline form, for other nodes' [snapshots] trusted_keys
	Trusted    []string `json:"trusted"`
}

// SandboxDefaults is the isolation in force for sandboxes and the node's default limits.
type SandboxDefaults struct {
	Isolation Isolation `json:"isolation"`
	Limits    Limits    `json:"default_limits"`
	// IDRangeFirst and IDRangeSize say where sandboxes' user namespace id ranges lie on the
	// host: range k is IDRangeFirst+k*IDRangeSize, IDRangeSize ids long.
	IDRangeFirst uint32 `json:"id_range_first"`
	IDRangeSize  uint32 `json:"id_range_size"`
}

// Component is a named piece of software with a version.
type Component struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Path    string `json:"path,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Containerd reports the containerd the daemon is connected to.
type Containerd struct {
	Address   string `json:"address"`
	Reachable bool   `json:"reachable"`
	Version   string `json:"version,omitempty"`
	Revision  string `json:"revision,omitempty"`
	Error     string `json:"error,omitempty"`
}

// CRIU reports the CRIU found at daemon start and whether L3 checkpoints are available.
type CRIU struct {
	Path        string `json:"path,omitempty"`
	Version     string `json:"version,omitempty"`
	CheckPassed bool   `json:"check_passed"`
	CheckOutput string `json:"check_output,omitempty"`
	L3Available bool   `json:"l3_available"`
	Reason      string `json:"reason,omitempty"`
}

// Host describes the kernel features DeltaBox relies on.
type Host struct {
	Kernel     string `json:"kernel"`
	Arch       string `json:"arch"`
	CgroupMode string `json:"cgroup_mode"`
	Overlayfs  bool   `json:"overlayfs"`
	// ChangeTracking says whether L1 checkpoints find changes with fanotify ("fanotify") or
	// walk the upper dir ("walk: <why>").
	ChangeTracking string `json:"change_tracking"`
}

// ObjectStore names where L3 snapshots go.
type ObjectStore struct {
	URI string `json:"uri"`
}
