package e2b

// Wire types of the e2b SDK's calls, written for this gateway from the protocol (the JSON the
// SDK sends and reads). Protobuf JSON conventions apply to the in-sandbox services: field
// names in lowerCamelCase, int64 as strings, bytes as base64, enums by name.

// --- control plane (REST) ---

// newSandboxRequest is the body of POST /sandboxes and /v2/sandboxes.
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout,omitempty"` // seconds
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	AutoPause           *bool             `json:"autoPause,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	Secure              *bool             `json:"secure,omitempty"`
}

// sandboxCreated answers a create or a connect.
type sandboxCreated struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

// sandboxListed is one sandbox of a list, and (with the token) the detail of one.
type sandboxListed struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       string            `json:"startedAt"`
	EndAt           string            `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	VolumeMounts    []struct{}        `json:"volumeMounts"`
}

type timeoutRequest struct {
	Timeout int64 `json:"timeout"` // seconds
}

type connectRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
	Memory  *bool  `json:"memory,omitempty"`
}

type forkRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
	Count   *int   `json:"count,omitempty"`
}

// forkResult is one fork: the sandbox made, or why it was not.
type forkResult struct {
	Sandbox *sandboxCreated `json:"sandbox,omitempty"`
	Error   *apiError       `json:"error,omitempty"`
}

type snapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// snapshotInfo answers createSnapshot and is one item of listSnapshots.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

type pauseRequest struct {
	Memory *bool `json:"memory,omitempty"`
}

// apiError is the control plane's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// metric is one sample of GET /sandboxes/{id}/metrics.
type metric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// --- envd HTTP ---

// fileEntry answers an upload, one per file written.
type fileEntry struct {
	Name string `json:"name"`
	Type string `json:"type"` // "file" | "dir"
	Path string `json:"path"`
}

// --- process.Process ---

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ptyConfig struct {
	Size *struct {
		Cols uint32 `json:"cols"`
		Rows uint32 `json:"rows"`
	} `json:"size,omitempty"`
}

type startRequest struct {
	Process processConfig `json:"process"`
	Pty     *ptyConfig    `json:"pty,omitempty"`
	Tag     *string       `json:"tag,omitempty"`
	Stdin   *bool         `json:"stdin,omitempty"`
}

type processSelector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type connectProcessRequest struct {
	Process processSelector `json:"process"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	Pty   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process processSelector `json:"process"`
	Input   processInput    `json:"input"`
}

type sendSignalRequest struct {
	Process processSelector `json:"process"`
	Signal  any             `json:"signal"` // "SIGNAL_SIGKILL" or 9, "SIGNAL_SIGTERM" or 15
}

type closeStdinRequest struct {
	Process processSelector `json:"process"`
}

type updateRequest struct {
	Process processSelector `json:"process"`
	Pty     *ptyConfig      `json:"pty,omitempty"`
}

type empty struct{}

type processInfo struct {
	Config processConfig `json:"config"`
	Pid    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

type startEvent struct {
	Pid uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *empty      `json:"keepalive,omitempty"`
}

// processEventMsg is the message of Start and Connect streams.
type processEventMsg struct {
	Event processEvent `json:"event"`
}

// --- filesystem.Filesystem ---

type pathRequest struct {
	Path string `json:"path"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryInfo struct {
	Name          string  `json:"name"`
	Type          string  `json:"type"`
	Path          string  `json:"path"`
	Size          string  `json:"size"` // int64
	Mode          uint32  `json:"mode"`
	Permissions   string  `json:"permissions"`
	Owner         string  `json:"owner"`
	Group         string  `json:"group"`
	ModifiedTime  string  `json:"modifiedTime"`
	SymlinkTarget *string `json:"symlinkTarget,omitempty"`
}

type entryResponse struct {
	Entry entryInfo `json:"entry"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

type watchRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

type fsEvent struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

type watchDirResponse struct {
	Start      *empty   `json:"start,omitempty"`
	Filesystem *fsEvent `json:"filesystem,omitempty"`
	Keepalive  *empty   `json:"keepalive,omitempty"`
}

type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

type watcherEventsResponse struct {
	Events []fsEvent `json:"events"`
}
