package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/deltabox/deltabox/internal/log"
)

// Lease labels that record a sandbox's E2B bookkeeping with its lease (which survives a
// daemon restart), so that a restarted gateway serves the sandboxes it created before. The
// access token is kept as its SHA-256 only.
const (
	labelTenant     = "e2b.tenant"
	labelTemplate   = "e2b.template"
	labelTokenHash  = "e2b.token_sha256"
	labelAutoPause  = "e2b.auto_pause"
	labelPerCommand = "e2b.per_command"
	labelStarted    = "e2b.started"
	labelMetaPrefix = "e2b.meta."
)

func tokenHash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// leaseLabels records sb's bookkeeping as lease labels.
func (sb *sandbox) leaseLabels() map[string]string {
	l := map[string]string{labelTenant: sb.tenant, labelTemplate: sb.template, labelTokenHash: sb.tokenHash[0],
		labelStarted: sb.started.UTC().Format(time.RFC3339Nano)}
	if sb.autoPause {
		l[labelAutoPause] = "true"
	}
	if sb.perCommand {
		l[labelPerCommand] = "true"
	}
	for k, v := range sb.metadata {
		l[labelMetaPrefix+k] = v
	}
	return l
}

// recover adopts the leased sandboxes whose labels say this gateway created them (before a
// restart). Each gets a fresh default timeout (the last one set is not recorded) and is
// thawed in case it was paused. Forks and restores need a connect for a new access token.
func (g *Gateway) recover(ctx context.Context) {
	for _, s := range g.b.Sandboxes() {
		tenant, hash := s.Labels[labelTenant], s.Labels[labelTokenHash]
		if tenant == "" || hash == "" || !g.knownTenant(tenant) {
			continue
		}
		started, err := time.Parse(time.RFC3339Nano, s.Labels[labelStarted])
		if err != nil {
			started = s.LeasedAt
		}
		sb := g.newSandbox(s.ID, s.Labels[labelTemplate], tenant, s.Workdir)
		sb.tokenHash, sb.started = []string{hash}, started
		if s.ForkedFrom != "" || s.RestoredFrom != "" {
			// A fork or restore carries its source's labels, token hash included: the source's
			// token must not open it. Its own token was never recorded; connect mints one.
			sb.tokenHash = nil
		}
		sb.autoPause, sb.perCommand = s.Labels[labelAutoPause] == "true", s.Labels[labelPerCommand] == "true"
		for k, v := range s.Labels {
			if strings.HasPrefix(k, labelMetaPrefix) {
				sb.metadata[strings.TrimPrefix(k, labelMetaPrefix)] = v
			}
		}
		_ = g.b.Thaw(ctx, s.ID) // not paused: an error, and nothing to do
		g.mu.Lock()
		g.sandboxes[sb.id] = sb
		g.mu.Unlock()
		sb.setTimeout(g.opts.DefaultTimeout)
		log.L(ctx).Info("e2b sandbox recovered", "sandbox", sb.id, "template", sb.template, "tenant", tenant)
	}
}

func (g *Gateway) knownTenant(t string) bool {
	for _, k := range g.keys {
		if k == t {
			return true
		}
	}
	return false
}
