package orchestrator

import (
	"context"
	"fmt"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deltabox/deltabox/criu/proctpl"
	"github.com/deltabox/deltabox/internal/log"
)

// Process templates cost memory only for the pages the sandbox changed since their
// checkpoint. [checkpoints] template_memory (node) and template_memory_sandbox bound that
// memory: after a checkpoint with processes, while a bound is exceeded, the templates of the
// sandbox's oldest checkpoints are dropped (never those of the checkpoint just taken), and
// the checkpoint says so. The node bound drops only the checkpointing sandbox's templates
// (each sandbox's lock is its own): another sandbox's shrink when they checkpoint.
//
// template_checkpoints bounds their number per sandbox, for the time of the next fork more
// than for memory: a template is a fork of the process, and a rollback runs a fork of the
// template, so after n checkpoints and rollbacks the running process descends from n
// templates; the kernel links each private memory area of a fork to every ancestor's
// anon_vma that is still alive, so the fork that makes the next template (in the frozen
// window) grows slower with every live template of its lineage (measured: a Python REPL's
// template 0.4 ms at the first generation, 3-4 ms at the 60th with all 64 retained). Beyond
// the bound the templates of the checkpoint used least recently (taken, or rolled back to:
// a search's root stays) are dropped first; once dead, the kernel reuses or frees their
// levels, and the lineage stops growing.

// keepTemplates records a new checkpoint's templates in the session.
func (s *session) keepTemplates(id string, tpls map[int]*proctpl.Template) {
	if len(tpls) == 0 {
		return
	}
	if s.tpls == nil {
		s.tpls = map[string]map[int]*proctpl.Template{}
	}
	s.tpls[id] = tpls
	s.tplCount.Add(int64(len(tpls)))
	s.usedTemplates(id)
}

// usedTemplates marks checkpoint id's templates used now (taken, or rolled back to).
func (s *session) usedTemplates(id string) {
	if s.tplUsed == nil {
		s.tplUsed = map[string]uint64{}
	}
	s.tplClock++
	s.tplUsed[id] = s.tplClock
}

// templateBytes measures the memory each checkpoint's templates hold alone, by checkpoint.
func (s *session) templateBytes() map[string]int64 {
	out := make(map[string]int64, len(s.tpls))
	var total int64
	for id, byPid := range s.tpls {
		for _, tp := range byPid {
			out[id] += tp.Bytes()
		}
		total += out[id]
	}
	s.tplBytes.Store(total)
	return out
}

// nodeTemplateBytes sums the last measured template memory of every session.
func (o *Orchestrator) nodeTemplateBytes() (count, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.sessions {
		count += s.tplCount.Load()
		bytes += s.tplBytes.Load()
	}
	return count, bytes
}

// boundTemplates drops the oldest templates of s while a bound is exceeded; newest is the
// checkpoint just taken, never dropped. Callers hold s.mu.
func (o *Orchestrator) boundTemplates(ctx context.Context, s *session, newest string) {
	o.boundTemplateCount(ctx, s, newest)
	if o.opts.TemplateMemory <= 0 && o.opts.TemplateMemorySandbox <= 0 {
		return
	}
	per := s.templateBytes()
	ids := make([]string, 0, len(per))
	for id := range per {
		if id != newest {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ckptNum(ids[i]) < ckptNum(ids[j]) })
	for _, id := range ids {
		_, node := o.nodeTemplateBytes()
		mine := s.tplBytes.Load()
		var why string
		switch {
		case o.opts.TemplateMemorySandbox > 0 && mine > o.opts.TemplateMemorySandbox:
			why = fmt.Sprintf("template_memory_sandbox (%d bytes) exceeded", o.opts.TemplateMemorySandbox)
		case o.opts.TemplateMemory > 0 && node > o.opts.TemplateMemory:
			why = fmt.Sprintf("template_memory (%d bytes on the node) exceeded", o.opts.TemplateMemory)
		default:
			return
		}
		s.dropTemplates(id, "its template was dropped: "+why)
		s.tplBytes.Add(-per[id])
		log.L(ctx).Info("process templates dropped", "sandbox", s.id, "checkpoint", id, "bytes", per[id], "reason", why)
	}
}

// boundTemplateCount drops the templates of the checkpoints used least recently while more
// than template_checkpoints of s keep some; newest is never dropped. Callers hold s.mu.
func (o *Orchestrator) boundTemplateCount(ctx context.Context, s *session, newest string) {
	limit := o.opts.TemplateCheckpoints
	if limit <= 0 || len(s.tpls) <= limit {
		return
	}
	ids := make([]string, 0, len(s.tpls))
	for id := range s.tpls {
		if id != newest {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool {
		if s.tplUsed[ids[i]] != s.tplUsed[ids[j]] {
			return s.tplUsed[ids[i]] < s.tplUsed[ids[j]]
		}
		return ckptNum(ids[i]) < ckptNum(ids[j])
	})
	why := fmt.Sprintf("template_checkpoints (%d per sandbox) exceeded", limit)
	for _, id := range ids[:len(s.tpls)-limit] { // evaluated once, before the drops
		s.dropTemplates(id, "its template was dropped: "+why)
		log.L(ctx).Info("process templates dropped", "sandbox", s.id, "checkpoint", id, "reason", why)
	}
}

// dropTemplates releases a checkpoint's templates and remembers why they are gone.
func (s *session) dropTemplates(id, why string) {
	if s.tplDropped == nil {
		s.tplDropped = map[string]string{}
	}
	s.tplDropped[id] = why
	s.releaseTemplates(id)
}

// templateGone says why a template of checkpoint id is missing.
func (s *session) templateGone(id string) string {
	if why := s.tplDropped[id]; why != "" {
		return why
	}
	return "its template is gone (the daemon restarted)"
}

// registerTemplateMetrics exports the node's template count and memory, and how many L3
// restores were lazy.
func (o *Orchestrator) registerTemplateMetrics(reg prometheus.Registerer) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "deltabox_process_templates",
			Help: "Process templates kept by checkpoints taken with processes."},
			func() float64 { n, _ := o.nodeTemplateBytes(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "deltabox_process_template_bytes",
			Help: "Memory the process templates hold alone (as last measured: by checkpoint ls or a bounded checkpoint)."},
			func() float64 { _, b := o.nodeTemplateBytes(); return float64(b) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "deltabox_l3_lazy_restores_total",
			Help: "L3 restores whose processes' memory came back lazily (criu lazy-pages)."},
			func() float64 { return float64(o.l3.LazyRestores()) }),
	)
}
