// Package pysdk embeds the Python SDK's package (sdk/python/deltabox) in the daemon, which puts
// it read-only into every sandbox (/.deltabox/sdk/python, on PYTHONPATH; docs/sandbox-api.md).
package pysdk

import "embed"

// Files holds deltabox/*.py and deltabox/py.typed.
//
//go:embed deltabox/*.py deltabox/py.typed
var Files embed.FS
