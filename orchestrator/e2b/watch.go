package e2b

import (
	"context"
	"fmt"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/deltabox/deltabox/internal/rootfs"
)

// Watching a directory polls it from the host (inotify cannot be used from outside the
// sandbox's mount namespace without entering it) and reports what changed between scans.
const (
	watchInterval   = 50 * time.Millisecond
	maxWatchEntries = 20000
	maxQueuedEvents = 10000
	maxWatchers     = 64
)

// sig is what a scan remembers of an entry.
type sig struct {
	ino, size, mtime int64
	mode             uint32
}

// scan lists dir (and, recursive, its subdirectories) as name -> sig, names relative to dir.
func scan(root *rootfs.Root, dir string, recursive bool) (map[string]sig, error) {
	out := map[string]sig{}
	var walkDir func(rel, prefix string, depth int) error
	walkDir = func(rel, prefix string, depth int) error {
		ents, err := root.ReadDir(rel)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if len(out) >= maxWatchEntries {
				return fmt.Errorf("watched tree holds more than %d entries: %w", maxWatchEntries, errdefs.ErrResourceExhausted)
			}
			name := path.Join(prefix, e.Name)
			out[name] = sig{ino: int64(e.Stat.Ino), size: e.Stat.Size, mtime: e.Stat.Mtim.Nano(), mode: e.Stat.Mode}
			if recursive && depth < maxListDepth && e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR {
				_ = walkDir(path.Join(rel, e.Name), name, depth+1) // a subdirectory may vanish meanwhile
			}
		}
		return nil
	}
	return out, walkDir(dir, "", 0)
}

// diff lists the events that turn before into after, in name order.
func diff(before, after map[string]sig) []fsEvent {
	var evs []fsEvent
	for name, a := range after {
		b, ok := before[name]
		switch {
		case !ok || b.ino != a.ino:
			evs = append(evs, fsEvent{Name: name, Type: "EVENT_TYPE_CREATE"})
		case b.size != a.size || b.mtime != a.mtime:
			evs = append(evs, fsEvent{Name: name, Type: "EVENT_TYPE_WRITE"})
		case b.mode != a.mode:
			evs = append(evs, fsEvent{Name: name, Type: "EVENT_TYPE_CHMOD"})
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			evs = append(evs, fsEvent{Name: name, Type: "EVENT_TYPE_REMOVE"})
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].Name < evs[j].Name })
	return evs
}

// poller scans a directory of a sandbox every watchInterval and hands on the changes.
type poller struct {
	g         *Gateway
	sb        *sandbox
	rel       string
	recursive bool
	last      map[string]sig
}

func (g *Gateway) newPoller(ctx context.Context, sb *sandbox, req *watchRequest) (*poller, error) {
	rel, abs, err := sb.resolve(req.Path)
	if err != nil {
		return nil, err
	}
	p := &poller{g: g, sb: sb, rel: rel, recursive: req.Recursive}
	err = g.withRoot(ctx, sb, func(root *rootfs.Root) error {
		if err := checkDir(root, rel, abs); err != nil {
			return err
		}
		last, err := scan(root, rel, req.Recursive)
		p.last = last
		return err
	})
	return p, err
}

// poll scans once and returns the changes since the last scan.
func (p *poller) poll(ctx context.Context) ([]fsEvent, error) {
	var evs []fsEvent
	err := p.g.withRoot(ctx, p.sb, func(root *rootfs.Root) error {
		now, err := scan(root, p.rel, p.recursive)
		if err != nil {
			return err
		}
		evs, p.last = diff(p.last, now), now
		return nil
	})
	return evs, err
}

func (g *Gateway) watchDir(ctx context.Context, sb *sandbox, req *watchRequest, s *stream, ka time.Duration) error {
	p, err := g.newPoller(ctx, sb, req)
	if err != nil {
		return err
	}
	if err := s.send(watchDirResponse{Start: &empty{}}); err != nil {
		return err
	}
	tick, keep := time.NewTicker(watchInterval), time.NewTicker(ka)
	defer tick.Stop()
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sb.ctx.Done():
			return fmt.Errorf("sandbox %q is gone: %w", sb.id, errdefs.ErrNotFound)
		case <-keep.C:
			if err := s.send(watchDirResponse{Keepalive: &empty{}}); err != nil {
				return err
			}
		case <-tick.C:
			if sb.isPaused() {
				continue
			}
			evs, err := p.poll(ctx)
			if err != nil {
				return err
			}
			for i := range evs {
				if err := s.send(watchDirResponse{Filesystem: &evs[i]}); err != nil {
					return err
				}
			}
		}
	}
}

// watcher is a polled watch whose events the SDK fetches (CreateWatcher/GetWatcherEvents).
type watcher struct {
	mu     sync.Mutex
	events []fsEvent
	err    error
	stop   context.CancelFunc
}

func (g *Gateway) createWatcher(ctx context.Context, sb *sandbox, req *watchRequest) (*createWatcherResponse, error) {
	p, err := g.newPoller(ctx, sb, req)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(sb.ctx)
	w := &watcher{stop: stop}
	id := randomToken()[:16]
	sb.mu.Lock()
	if len(sb.watchers) >= maxWatchers {
		sb.mu.Unlock()
		stop()
		return nil, fmt.Errorf("sandbox has %d watchers already: %w", maxWatchers, errdefs.ErrResourceExhausted)
	}
	sb.watchers[id] = w
	sb.mu.Unlock()
	go w.run(wctx, p)
	return &createWatcherResponse{WatcherID: id}, nil
}

func (w *watcher) run(ctx context.Context, p *poller) {
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if p.sb.isPaused() {
				continue
			}
			evs, err := p.poll(ctx)
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.events = append(w.events, evs...)
			if len(w.events) > maxQueuedEvents {
				w.events = w.events[len(w.events)-maxQueuedEvents:]
			}
			w.mu.Unlock()
		}
	}
}

func (sb *sandbox) watcher(id string) (*watcher, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if w := sb.watchers[id]; w != nil {
		return w, nil
	}
	return nil, fmt.Errorf("watcher %q not found: %w", id, errdefs.ErrNotFound)
}

func (g *Gateway) watcherEvents(ctx context.Context, sb *sandbox, req *watcherRequest) (*watcherEventsResponse, error) {
	w, err := sb.watcher(req.WatcherID)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := &watcherEventsResponse{Events: append([]fsEvent{}, w.events...)}
	w.events = nil
	if len(out.Events) == 0 && w.err != nil {
		return nil, w.err
	}
	return out, nil
}

func (g *Gateway) removeWatcher(ctx context.Context, sb *sandbox, req *watcherRequest) (*empty, error) {
	w, err := sb.watcher(req.WatcherID)
	if err != nil {
		return nil, err
	}
	w.stop()
	sb.mu.Lock()
	delete(sb.watchers, req.WatcherID)
	sb.mu.Unlock()
	return &empty{}, nil
}
