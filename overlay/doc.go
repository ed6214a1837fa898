// Package overlay owns the filesystem half of a sandbox checkpoint: it captures what changed in
// an overlayfs upper dir (incrementally, L1, or completely, L2) into a per-sandbox layer store,
// rolls the sandbox's merged mount back to any stored checkpoint, verifies a merged tree
// against a checkpoint (a full no-follow walk, read only), diffs checkpoints and moves
// checkpoints in and out as OCI layer tars.
//
// What an L1 capture must look at comes from a change tracker (track_linux.go: one fanotify
// group per process, a filesystem mark, file handles for directories and changed inodes)
// instead of a walk of the whole upper dir; a capture is Prepare (while the sandbox is
// frozen: find changes, copy contents) and Commit (after: the manifest, which carries the
// caller's record, made durable).
//
// It reads the upper dir (never writes it while mounted) and writes only through the merged
// mount, resolving every path inside the sandbox root without following a symlink the sandbox
// made. It must not freeze or thaw the sandbox (the orchestrator does that around Capture and
// Rollback), mount or unmount a sandbox's rootfs, or know about containerd, agent state or
// effects.
//
// Store layout: one pack file per checkpoint (<dir>/<id>.ckpt: file contents, then the JSON
// manifest, then a footer) written to a temp file, fsynced and renamed, so a crash mid-capture
// leaves the previous checkpoint intact. A rollback leaves a small durable record
// (rollback.json) until the next capture absorbs it. One empty temp file is kept ready (made
// in the background after each write) so that the frozen window never pays for creating an
// inode; temp files left behind are removed when the store is opened. Every file entry
// carries an XXH3-64 digest of its content (manifest version 2; version 1 packs load
// unchecked), computed while it is copied and checked before the content is used: a rollback
// or export refuses damaged content (DamageError, naming checkpoint and path) before writing
// anything, Verify reports it, Scrub checks every pack. A pack whose manifest is damaged, and
// the checkpoints that depend on it, are set aside (<id>.ckpt.damaged-<time>) when the store
// opens; the checkpoints before it stay usable.
package overlay
