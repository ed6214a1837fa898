// Package proxy is DeltaBox's egress proxy. It owns everything a sandbox sends to the network:
// identifying the sandbox by the connection's source IP, the egress policy (pass, hold,
// compensate, deny), HTTPS interception with the node's own CA, the per-sandbox effect journal
// (held and compensable requests, durable before the sandbox gets its answer) and releasing,
// dropping or compensating those effects when the orchestrator commits or rolls back.
//
// It must not know about containers, checkpoints' contents or the API: the orchestrator tells
// it which IP belongs to which sandbox and which checkpoint is current, and calls Commit and
// Rollback. It never trusts anything a sandbox sends (hosts, SNI, headers, bodies), never
// dials an address of the node itself or a non-global one unless a policy rule names the host
// exactly (destination.go), bounds what a sandbox may hold open (limits.go), and never offers
// HTTP/2 to a sandbox, so that every request passes through the policy.
//
// Delivery of held effects is at least once, every attempt with the same
// Idempotency-Key ("deltabox-" and the effect ID): exactly once at an upstream that honours
// the key, and no more than that is promised (commit.go).
package proxy
