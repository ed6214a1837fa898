//go:build linux

package overlay

import (
	"fmt"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// view answers "what does the merged tree look like at a checkpoint": the checkpoint's upper
// state over the (unchanging) lower layers, with overlayfs's rules for whiteouts, opaque
// directories and non-directories hiding what is below them. Lower layers are read without
// following symlinks.
type view struct {
	upper    map[string]*Entry
	layers   []string
	fds      []int
	dirs     []*dirCache // each layer's directories, resolved once (the layers never change)
	stats    map[lowerKey]*lowerStat
	children map[string][]string // upper-state names by parent, built on first use
	ids      idShift             // how the merged tree shows the lower layers' owners
}

type lowerKey struct {
	layer int
	path  string
}

type lowerStat struct {
	st     unix.Stat_t
	dir    bool
	opaque bool
}

// newView opens the lower layers (topmost first) under the given upper state.
func newView(upper map[string]*Entry, lowers []string) (*view, error) {
	v := &view{upper: upper, layers: lowers, stats: map[lowerKey]*lowerStat{}}
	for _, l := range lowers {
		fd, err := openRoot(l)
		if err != nil {
			v.close()
			return nil, fmt.Errorf("open lower layer: %w", err)
		}
		v.fds = append(v.fds, fd)
		v.dirs = append(v.dirs, newDirCache(fd))
	}
	return v, nil
}

func (v *view) close() {
	for _, c := range v.dirs {
		c.close()
	}
	for _, fd := range v.fds {
		unix.Close(fd)
	}
	v.fds, v.dirs = nil, nil
}

// lookup returns the entry at p in the merged view, or nil when p does not exist there.
func (v *view) lookup(p string) (*Entry, error) {
	e, _, err := v.resolve(p)
	return e, err
}

// resolve walks p component by component ("" is the root). For a directory it also returns the lower layers
// whose copy of it is merged in (none when an opaque directory or a non-directory cuts them).
func (v *view) resolve(p string) (*Entry, []int, error) {
	active := make([]int, len(v.fds))
	for i := range active {
		active[i] = i
	}
	if p == "" { // the root: every layer's root is merged in
		return &Entry{Kind: KindDir}, active, nil
	}
	comps := strings.Split(p, "/")
	prefix := ""
	for k, c := range comps {
		prefix = joinPath(prefix, c)
		last := k == len(comps)-1
		ue := v.upper[prefix]
		if ue != nil && ue.Kind != KindDir {
			if ue.Kind == KindWhiteout || !last {
				return nil, nil, nil
			}
			return ue, nil, nil
		}
		var top *lowerStat
		topLayer, next := -1, []int(nil)
		if ue == nil || !ue.Opaque {
			var err error
			if top, topLayer, next, err = v.descend(active, prefix); err != nil {
				return nil, nil, err
			}
		}
		active = next
		switch {
		case ue != nil:
			if last {
				return ue, active, nil
			}
		case top == nil, !last && !top.dir:
			return nil, nil, nil
		case last:
			e, err := v.lowerEntry(topLayer, prefix)
			return e, active, err
		}
	}
	return nil, nil, nil
}

// descend looks prefix up in the active layers, topmost first: it returns the topmost visible
// entry and the layers in which prefix is a directory that is merged in.
func (v *view) descend(active []int, prefix string) (*lowerStat, int, []int, error) {
	var top *lowerStat
	topLayer := -1
	var next []int
	for _, i := range active {
		ls, err := v.lstat(i, prefix)
		if err != nil {
			return nil, -1, nil, err
		}
		if ls == nil {
			continue
		}
		if kindOf(&ls.st) == KindWhiteout {
			break
		}
		if top == nil {
			top, topLayer = ls, i
		}
		if !ls.dir {
			break
		}
		next = append(next, i)
		if ls.opaque {
			break
		}
	}
	return top, topLayer, next, nil
}

// lstat stats prefix in one layer (nil when absent), caching the answer.
func (v *view) lstat(layer int, prefix string) (*lowerStat, error) {
	k := lowerKey{layer, prefix}
	if ls, ok := v.stats[k]; ok {
		return ls, nil
	}
	ls, err := v.lstatUncached(layer, prefix)
	if err != nil {
		return nil, err
	}
	v.stats[k] = ls
	return ls, nil
}

func (v *view) lstatUncached(layer int, prefix string) (*lowerStat, error) {
	dir, name := splitPath(prefix)
	pfd, err := v.dirs[layer].get(dir)
	if isNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lower %s: %q: %w", v.layers[layer], prefix, err)
	}
	ls := &lowerStat{}
	if err := unix.Fstatat(pfd, name, &ls.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if isNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("lower %s: stat %q: %w", v.layers[layer], prefix, err)
	}
	ls.dir = ls.st.Mode&unix.S_IFMT == unix.S_IFDIR
	if ls.dir {
		val, err := getXattrAt(pfd, name, "trusted.overlay.opaque")
		ls.opaque = err == nil && string(val) == "y"
	}
	return ls, nil
}

// lowerEntry describes prefix as found in a lower layer.
func (v *view) lowerEntry(layer int, prefix string) (*Entry, error) {
	pfd, err := v.dirs[layer].get(parentOf(prefix))
	if err != nil {
		return nil, fmt.Errorf("lower %s: %q: %w", v.layers[layer], prefix, err)
	}
	e, err := describe(pfd, prefix, &v.stats[lowerKey{layer, prefix}].st)
	if err != nil {
		return nil, err
	}
	e.Opaque = false
	e.lower = v.layers[layer]
	v.ids.apply(e)
	return e, nil
}

// childNames lists the names present under directory p in the view, sorted.
func (v *view) childNames(p string) ([]string, error) {
	e, active, err := v.resolve(p)
	if err != nil || e == nil || e.Kind != KindDir {
		return nil, err
	}
	cand := map[string]bool{}
	for _, n := range v.upperChildren(p) {
		cand[n] = true
	}
	for _, i := range active {
		names, err := v.readLowerDir(i, p)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			cand[n] = true
		}
	}
	var out []string
	for n := range cand {
		ce, err := v.lookup(joinPath(p, n))
		if err != nil {
			return nil, err
		}
		if ce != nil {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// upperChildren returns the names the upper state holds directly under p.
func (v *view) upperChildren(p string) []string {
	if v.children == nil {
		v.children = map[string][]string{}
		for q := range v.upper {
			dir, name := splitPath(q)
			v.children[dir] = append(v.children[dir], name)
		}
	}
	return v.children[p]
}

// readLowerDir lists directory p of one layer.
func (v *view) readLowerDir(layer int, p string) ([]string, error) {
	fd, err := openBeneath(v.fds[layer], p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, fmt.Errorf("lower %s: open %q: %w", v.layers[layer], p, err)
	}
	defer unix.Close(fd)
	return readDirNames(fd)
}

// linkGroups maps each hard-link group of the upper state to its paths.
func (v *view) linkGroups() map[string][]string {
	groups := map[string][]string{}
	for p, e := range v.upper {
		if e.Link != "" {
			groups[e.Link] = append(groups[e.Link], p)
		}
	}
	return groups
}
