// Package state owns a sandbox's agent state: one JSON document (initially {}), changed only by
// patches, and the durable op log that lets the document be rolled back to any earlier point.
// It persists to one directory per sandbox and must not know about containers, overlays,
// effects or the HTTP API: the caller passes checkpoint IDs as opaque strings, records Seq()
// in its own checkpoint records and decides what to compact.
//
// # Ops
//
// Patches use the RFC 6902 ops (add, remove, replace, move, copy, test) with RFC 6901
// pointers, plus DeltaBox's append: {"op":"append","path":P,"value":V} adds V as the last
// element of the array at P; if P names a missing member of an existing object, the member is
// created as [V]. Any other target (a non-array value, a missing parent, a missing array
// element, the root when it is not an array) is an error. V is a single element even if it is
// an array. A patch applies all of its ops or none.
//
// Every op is logged with its sequence number, the caller's checkpoint ID and its inverse, a
// list of ops computed from the document just before the op was applied: replace -> replace
// with the old value; add to an object -> remove (or replace with the old value if the member
// existed); add to an array -> remove at the concrete index ("-" resolved); remove -> add the
// old value; move -> move back (or, when the move overwrote a member or the move back would be
// illegal, replace/remove at the target then add at the source); copy -> like add; test ->
// nothing; append -> remove at the old length, or remove the member append created.
//
// The op engine is our own, over values decoded with json.Decoder.UseNumber (numbers stay
// exact). We do not use a JSON Patch library because inverses must be computed from the
// pre-state of each individual op inside a patch, and libraries such as evanphx/json-patch
// apply a whole patch without exposing the intermediate documents or the values an op removed
// or overwrote.
//
// # Sequence numbers and rollback
//
// Numbering is monotonic and never reused. Each op takes the next number; so does each
// rollback, as a marker in the history. RollbackTo(k) undoes the ops after k newest first and
// removes them from the history: Log no longer returns them and they are no longer rollback
// targets. Seq() is then the marker's number, so an IfSeq taken before the rollback conflicts.
//
// # Durability
//
// The log (state.log) is append-only: one CRC-32C framed JSON record per patch or rollback,
// fsynced before the call returns; concurrent calls share fsyncs (group commit). A torn final
// record left by a crash is cut off on Open. Readers may observe a patch while its fsync is in
// flight; if that fsync fails the store refuses all calls until it is reopened from disk.
// Full snapshots (snapshot.json, written atomically) bound replay; Compact rewrites the log
// to start at a given point.
package state
