package state

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"
)

// errTestFailed marks a "test" op whose value does not match; Patch reports it as
// errdefs.ErrFailedPrecondition rather than ErrInvalidArgument.
var errTestFailed = errors.New("test failed")

// document is the live JSON value plus the length of its canonical encoding, kept exact op by
// op so the size limit needs no re-encoding of the whole document.
//
// The document owns every map and slice reachable from root: values are decoded fresh for each
// op, copied for "copy", and old values are encoded into inverse ops at once, so no caller ever
// holds a reference into it.
type document struct {
	root     any
	size     int64
	maxSize  int64 // per op, in applyOps (0: none)
	maxDepth int   // per op, in applyOps and on replay (0: none)
}

func newDocument(root any) (*document, error) {
	enc, err := encode(root)
	if err != nil {
		return nil, err
	}
	return &document{root: root, size: int64(len(enc))}, nil
}

// get returns the value at p.
func (d *document) get(p pointer) (any, error) {
	cur := d.root
	for i, tok := range p {
		next, err := childOf(cur, tok)
		if err != nil {
			return nil, fmt.Errorf("at %q: %w", p[:i+1].String(), err)
		}
		cur = next
	}
	return cur, nil
}

func childOf(node any, tok string) (any, error) {
	switch n := node.(type) {
	case map[string]any:
		v, ok := n[tok]
		if !ok {
			return nil, errPathNotFound
		}
		return v, nil
	case []any:
		i, err := arrayIndex(tok, len(n), false)
		if err != nil {
			return nil, err
		}
		return n[i], nil
	default:
		return nil, fmt.Errorf("parent is %s, not an object or array: %w", kindOf(node), errPathNotFound)
	}
}

func kindOf(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	default:
		return "a number"
	}
}

// editFunc changes the container that holds a pointer's last token and returns the container
// to store in its place (an insert may reallocate a slice).
type editFunc func(container any, tok string) (any, error)

// edit runs fn on the parent of p (p is not the root) and stores the result back.
func (d *document) edit(p pointer, fn editFunc) error {
	root, err := editIn(d.root, p, 0, fn)
	if err != nil {
		return err
	}
	d.root = root
	return nil
}

func editIn(node any, p pointer, depth int, fn editFunc) (any, error) {
	if depth == len(p)-1 {
		out, err := fn(node, p[depth])
		if err != nil {
			return nil, fmt.Errorf("at %q: %w", p.String(), err)
		}
		return out, nil
	}
	child, err := childOf(node, p[depth])
	if err != nil {
		return nil, fmt.Errorf("at %q: %w", p[:depth+1].String(), err)
	}
	nc, err := editIn(child, p, depth+1, fn)
	if err != nil {
		return nil, err
	}
	switch n := node.(type) {
	case map[string]any:
		n[p[depth]] = nc
	case []any:
		i, _ := arrayIndex(p[depth], len(n), false) // resolved by childOf above
		n[i] = nc
	}
	return node, nil
}

func notContainer(c any) error {
	return fmt.Errorf("parent is %s, not an object or array: %w", kindOf(c), errPathNotFound)
}

// comma is the separator an insert adds to (or a removal takes from) a container that has, or
// keeps, other elements.
func comma(others int) int64 {
	if others > 0 {
		return 1
	}
	return 0
}

// add implements RFC 6902 add (insert into an array, set an object member, or replace the
// root) and returns its inverse.
func (d *document) add(p pointer, v any, venc []byte) ([]Op, error) {
	if len(p) == 0 {
		return d.replaceRoot(v, venc)
	}
	var inv Op
	var delta int64
	err := d.edit(p, func(c any, tok string) (any, error) {
		switch c := c.(type) {
		case map[string]any:
			var err error
			inv, delta, err = setMember(c, p, v, venc)
			return c, err
		case []any:
			i, err := arrayIndex(tok, len(c), true)
			if err != nil {
				return nil, err
			}
			inv = Op{Op: OpRemove, Path: p.parent().child(strconv.Itoa(i)).String()}
			delta = int64(len(venc)) + comma(len(c))
			return insertAt(c, i, v), nil
		default:
			return nil, notContainer(c)
		}
	})
	if err != nil {
		return nil, err
	}
	d.size += delta
	return []Op{inv}, nil
}

// setMember sets m[p.last()] and returns the inverse and the size change.
func setMember(m map[string]any, p pointer, v any, venc []byte) (Op, int64, error) {
	k := p.last()
	old, existed := m[k]
	if !existed {
		m[k] = v
		return Op{Op: OpRemove, Path: p.String()}, keyLen(k) + 1 + int64(len(venc)) + comma(len(m)-1), nil
	}
	oldEnc, err := encode(old)
	if err != nil {
		return Op{}, 0, err
	}
	m[k] = v
	return Op{Op: OpReplace, Path: p.String(), Value: oldEnc}, int64(len(venc) - len(oldEnc)), nil
}

func insertAt(a []any, i int, v any) []any {
	a = append(a, nil)
	copy(a[i+1:], a[i:])
	a[i] = v
	return a
}

// replaceRoot swaps the whole document.
func (d *document) replaceRoot(v any, venc []byte) ([]Op, error) {
	oldEnc, err := encode(d.root)
	if err != nil {
		return nil, err
	}
	d.root, d.size = v, int64(len(venc))
	return []Op{{Op: OpReplace, Path: "", Value: oldEnc}}, nil
}

// remove takes the value at p (not the root) out of the document and returns it with its
// encoding.
func (d *document) remove(p pointer) (any, []byte, error) {
	if len(p) == 0 {
		return nil, nil, errors.New("cannot remove the document root")
	}
	var old any
	var oldEnc []byte
	err := d.edit(p, func(c any, tok string) (any, error) {
		var err error
		switch c := c.(type) {
		case map[string]any:
			var ok bool
			if old, ok = c[tok]; !ok {
				return nil, errPathNotFound
			}
			if oldEnc, err = encode(old); err != nil {
				return nil, err
			}
			delete(c, tok)
			d.size -= keyLen(tok) + 1 + int64(len(oldEnc)) + comma(len(c))
			return c, nil
		case []any:
			return removeElem(c, tok, &old, &oldEnc, &d.size)
		default:
			return nil, notContainer(c)
		}
	})
	return old, oldEnc, err
}

func removeElem(a []any, tok string, old *any, oldEnc *[]byte, size *int64) ([]any, error) {
	i, err := arrayIndex(tok, len(a), false)
	if err != nil {
		return nil, err
	}
	if *oldEnc, err = encode(a[i]); err != nil {
		return nil, err
	}
	*old = a[i]
	copy(a[i:], a[i+1:])
	a[len(a)-1] = nil
	a = a[:len(a)-1]
	*size -= int64(len(*oldEnc)) + comma(len(a))
	return a, nil
}

// replace sets the existing value at p and returns the inverse.
func (d *document) replace(p pointer, v any, venc []byte) ([]Op, error) {
	if len(p) == 0 {
		return d.replaceRoot(v, venc)
	}
	if _, err := d.get(p); err != nil {
		return nil, err
	}
	// p exists: add replaces an object member; for an array element, remove then insert.
	if _, isMap := mustGet(d, p.parent()).(map[string]any); isMap {
		return d.add(p, v, venc)
	}
	_, oldEnc, err := d.remove(p)
	if err != nil {
		return nil, err
	}
	if _, err := d.add(p, v, venc); err != nil {
		return nil, err
	}
	return []Op{{Op: OpReplace, Path: p.String(), Value: oldEnc}}, nil
}

// mustGet returns the value at p, which the caller knows exists.
func mustGet(d *document, p pointer) any {
	v, _ := d.get(p)
	return v
}

// move implements RFC 6902 move as remove(from) then add(path). Its inverse undoes the add in
// the intermediate document, then the remove: "move back" when the add was an insertion
// (array indexes are the concrete ones after the removal), else "replace path with its old
// value" followed by "add from".
func (d *document) move(from, to pointer) ([]Op, error) {
	if from.equal(to) {
		_, err := d.get(from)
		return []Op{}, err
	}
	v, venc, err := d.remove(from)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	inv, err := d.add(to, v, venc)
	if err != nil {
		if _, uerr := d.add(from, v, venc); uerr != nil {
			return nil, fmt.Errorf("%w (and restoring from failed: %v): %w", err, uerr, errdefs.ErrInternal)
		}
		return nil, err
	}
	back := Op{Op: OpAdd, Path: from.String(), Value: venc}
	if inv[0].Op != OpRemove {
		return append(inv, back), nil
	}
	dest, _ := parsePointer(inv[0].Path)
	if dest.properPrefixOf(from) { // "move" may not name a location inside its source
		return append(inv, back), nil
	}
	return []Op{{Op: OpMove, From: inv[0].Path, Path: from.String()}}, nil
}

// copyValue implements RFC 6902 copy: add(path, a deep copy of the value at from).
func (d *document) copyValue(from, to pointer) ([]Op, error) {
	v, err := d.get(from)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	c := deepCopy(v)
	enc, err := encode(c)
	if err != nil {
		return nil, err
	}
	return d.add(to, c, enc)
}

// appendTo implements DeltaBox's append op. If the value at p is an array, v is added as its
// new last element (inverse: remove p/<old length>). If p names a missing member of an
// existing object, the member is created as [v] (inverse: remove p). Anything else is an
// error: p is something other than an array, p's parent is missing or is not an object (a
// missing array element is never created). v is one element even when it is itself an array.
func (d *document) appendTo(p pointer, v any, venc []byte) ([]Op, error) {
	target, err := d.get(p)
	if err == nil {
		if _, ok := target.([]any); !ok {
			return nil, fmt.Errorf("at %q: target is %s, not an array", p.String(), kindOf(target))
		}
		return d.add(p.child("-"), v, venc)
	}
	if len(p) == 0 || !errors.Is(err, errPathNotFound) {
		return nil, err
	}
	parent, perr := d.get(p.parent())
	if perr != nil {
		return nil, perr
	}
	if _, ok := parent.(map[string]any); !ok {
		return nil, err
	}
	arrEnc := make([]byte, 0, len(venc)+2)
	arrEnc = append(append(append(arrEnc, '['), venc...), ']')
	return d.add(p, []any{v}, arrEnc)
}

// test implements RFC 6902 test.
func (d *document) test(p pointer, want any) error {
	got, err := d.get(p)
	if err != nil {
		return fmt.Errorf("%w: %w", errTestFailed, err)
	}
	if !deepEqual(got, want) {
		return fmt.Errorf("%w: value at %q differs", errTestFailed, p.String())
	}
	return nil
}

// applyOp applies one op and returns the ops that undo it, computed from the pre-state. On
// error the document is unchanged.
func (d *document) applyOp(c compiledOp) ([]Op, error) {
	switch c.kind {
	case OpAdd:
		return d.add(c.path, c.value, c.venc)
	case OpRemove:
		_, oldEnc, err := d.remove(c.path)
		if err != nil {
			return nil, err
		}
		return []Op{{Op: OpAdd, Path: c.path.String(), Value: oldEnc}}, nil
	case OpReplace:
		return d.replace(c.path, c.value, c.venc)
	case OpMove:
		return d.move(c.from, c.path)
	case OpCopy:
		return d.copyValue(c.from, c.path)
	case OpTest:
		return []Op{}, d.test(c.path, c.value)
	case OpAppend:
		return d.appendTo(c.path, c.value, c.venc)
	}
	return nil, fmt.Errorf("unknown op %q", c.kind)
}

// applyOps applies ops in order, all or nothing: when one fails, the inverses of those already
// applied are applied newest first and the error (an *OpError) names the failing op.
func (d *document) applyOps(ops []compiledOp, src []Op) ([][]Op, error) {
	invs := make([][]Op, 0, len(ops))
	for i, c := range ops {
		inv, err := d.applyChecked(c)
		if err == nil {
			invs = append(invs, inv)
			continue
		}
		if uerr := d.undo(invs); uerr != nil {
			return nil, uerr
		}
		var class error = errdefs.ErrInvalidArgument
		if errors.Is(err, errTestFailed) {
			class = errdefs.ErrFailedPrecondition
		}
		return nil, opError(i, src[i], err, class)
	}
	return invs, nil
}

// applyChecked is applyOp within the document's depth and size limits: an op past either is
// refused (undone, when its size is known only after it applied).
func (d *document) applyChecked(c compiledOp) ([]Op, error) {
	if err := d.checkDepth(c); err != nil {
		return nil, err
	}
	before := d.size
	inv, err := d.applyOp(c)
	if err != nil {
		return nil, err
	}
	if serr := d.checkSize(before); serr != nil {
		if uerr := d.applyList(inv); uerr != nil {
			return nil, fmt.Errorf("undo: %w: %w", uerr, errdefs.ErrInternal)
		}
		return nil, serr
	}
	return inv, nil
}

// undo applies the inverse lists newest first. It fails only if the document no longer matches
// the inverses, which is an internal error.
func (d *document) undo(invs [][]Op) error {
	for i := len(invs) - 1; i >= 0; i-- {
		if err := d.applyList(invs[i]); err != nil {
			return fmt.Errorf("undo: %w: %w", err, errdefs.ErrInternal)
		}
	}
	return nil
}

// applyList applies ops in order, ignoring their inverses.
func (d *document) applyList(ops []Op) error {
	for _, o := range ops {
		c, err := compileOp(o, 0)
		if err != nil {
			return err
		}
		if _, err := d.applyOp(c); err != nil {
			return fmt.Errorf("%s %q: %w", o.Op, o.Path, err)
		}
	}
	return nil
}
