package state

import "fmt"

// DefaultMaxDepth bounds how deeply the document nests (objects and arrays within each other).
// Every function that walks a value recurses once per level, so an unbounded depth (reached
// cheaply by repeated "copy" of a subtree into itself) would end in a stack overflow.
const DefaultMaxDepth = 128

// WithMaxDepth limits the document's nesting to n levels of objects and arrays (0: no limit).
// Ops are checked as they are applied and again when the log is replayed on Open.
func WithMaxDepth(n int) Option { return func(o *options) { o.maxDepth = n } }

// deeperThan reports whether v nests more than budget levels of containers: a scalar has
// depth 0, an object or array one more than its deepest member. It stops at the first
// member past the budget, so its own recursion is bounded by budget.
func deeperThan(v any, budget int) bool {
	switch v := v.(type) {
	case map[string]any:
		if budget == 0 {
			return true
		}
		for _, e := range v {
			if deeperThan(e, budget-1) {
				return true
			}
		}
	case []any:
		if budget == 0 {
			return true
		}
		for _, e := range v {
			if deeperThan(e, budget-1) {
				return true
			}
		}
	}
	return false
}

// checkDepth refuses an op whose result would nest the document deeper than d.maxDepth: the
// value it places (its own, or for copy and move the one at "from"), below its path.
func (d *document) checkDepth(c compiledOp) error {
	if d.maxDepth <= 0 {
		return nil
	}
	var v any
	below := len(c.path)
	switch c.kind {
	case OpAdd, OpReplace:
		v = c.value
	case OpAppend:
		v, below = c.value, below+1 // the element of an array at path
	case OpCopy, OpMove:
		got, err := d.get(c.from)
		if err != nil {
			return nil // the op itself reports it
		}
		v = got
	default:
		return nil
	}
	if below > d.maxDepth || deeperThan(v, d.maxDepth-below) {
		return fmt.Errorf("the document would nest deeper than the limit of %d levels at %q", d.maxDepth, c.path.String())
	}
	return nil
}

// checkSize refuses an op that grew the document past d.maxSize (bytes of its canonical
// encoding); before is the size the op started from.
func (d *document) checkSize(before int64) error {
	if d.maxSize <= 0 || d.size <= d.maxSize || d.size <= before {
		return nil
	}
	return fmt.Errorf("the document would be %d bytes, more than the limit of %d", d.size, d.maxSize)
}
