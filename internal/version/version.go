// Package version holds the build's version and git commit, stamped at link time with
// -ldflags "-X github.com/deltabox/deltabox/internal/version.Version=... -X ...Commit=...".
package version

// Version is the release version of this build ("dev" when not stamped).
var Version = "dev"

// Commit is the git commit this build was made from ("unknown" when not stamped).
var Commit = "unknown"
