package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
)

// Op kinds: the six of RFC 6902 plus DeltaBox's append.
const (
	OpAdd     = "add"
	OpRemove  = "remove"
	OpReplace = "replace"
	OpMove    = "move"
	OpCopy    = "copy"
	OpTest    = "test"
	OpAppend  = "append"
)

// Op is one patch operation in RFC 6902 form. Value holds raw JSON; a JSON null value is the
// four bytes "null", an absent value is nil. From is used by move and copy only.
type Op struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	From  string          `json:"from,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
}

// clone returns a copy of o that shares no bytes with it.
func (o Op) clone() Op {
	o.Value = bytes.Clone(o.Value)
	return o
}

// opWire tells an absent "from" from an empty one (the root).
type opWire struct {
	Op    string          `json:"op"`
	Path  *string         `json:"path,omitempty"`
	From  *string         `json:"from,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
}

// MarshalJSON always writes "from" for move and copy, even when it is "" (the root).
func (o Op) MarshalJSON() ([]byte, error) {
	w := opWire{Op: o.Op, Path: &o.Path, Value: o.Value}
	if o.From != "" || o.Op == OpMove || o.Op == OpCopy {
		w.From = &o.From
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes an op; members it does not know are ignored (RFC 6902 section 4).
// A missing "path", or a missing "from" for move/copy, is an error.
func (o *Op) UnmarshalJSON(b []byte) error {
	var w opWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if w.Path == nil {
		return errors.New(`missing member "path"`)
	}
	if w.From == nil && (w.Op == OpMove || w.Op == OpCopy) {
		return fmt.Errorf(`op %q needs member "from"`, w.Op)
	}
	*o = Op{Op: w.Op, Path: *w.Path, Value: w.Value}
	if w.From != nil {
		o.From = *w.From
	}
	return nil
}

// ParseOps parses a JSON array of ops, or a single op object, and checks each op's shape
// (known kind, well-formed pointers, value present where required). Errors wrap
// errdefs.ErrInvalidArgument and name the op index.
func ParseOps(data []byte) ([]Op, error) {
	data = bytes.TrimSpace(data)
	var ops []Op
	if len(data) > 0 && data[0] == '{' {
		var one Op
		if err := json.Unmarshal(data, &one); err != nil {
			return nil, opError(0, Op{}, err, errdefs.ErrInvalidArgument)
		}
		ops = []Op{one}
	} else if err := json.Unmarshal(data, &ops); err != nil {
		return nil, fmt.Errorf("parse patch (want a JSON array of ops or one op object): %w: %w", err, errdefs.ErrInvalidArgument)
	}
	for i, o := range ops {
		if _, err := compileOp(o, 0); err != nil {
			return nil, opError(i, o, err, errdefs.ErrInvalidArgument)
		}
	}
	return ops, nil
}

// OpError reports which op of a patch failed and why. It unwraps to its class
// (errdefs.ErrInvalidArgument, or errdefs.ErrFailedPrecondition for a failed "test") and to
// the cause.
type OpError struct {
	Index int    // position of the op in the patch, from 0
	Op    string // the op's kind
	Path  string // the op's path
	Err   error  // the cause
	class error
}

func opError(i int, o Op, err, class error) *OpError {
	return &OpError{Index: i, Op: o.Op, Path: o.Path, Err: err, class: class}
}

func (e *OpError) Error() string {
	return fmt.Sprintf("op %d (%s %q): %v: %v", e.Index, e.Op, e.Path, e.Err, e.class)
}

// Unwrap returns the error class and the cause.
func (e *OpError) Unwrap() []error { return []error{e.class, e.Err} }

// compiledOp is an op with parsed pointers and a freshly decoded value that the document may
// take ownership of.
type compiledOp struct {
	kind  string
	path  pointer
	from  pointer
	value any
	venc  []byte // canonical encoding of value (add, replace, append)
}

// compileOp validates o and decodes its value. maxValue > 0 limits the raw value's size.
func compileOp(o Op, maxValue int) (compiledOp, error) {
	c := compiledOp{kind: o.Op}
	var err error
	if c.path, err = parsePointer(o.Path); err != nil {
		return c, err
	}
	switch o.Op {
	case OpRemove:
		return c, nil
	case OpMove, OpCopy:
		c.from, err = parsePointer(o.From)
		if err != nil {
			return c, fmt.Errorf("from: %w", err)
		}
		if o.Op == OpMove && c.from.properPrefixOf(c.path) {
			return c, errors.New(`"from" is a proper prefix of "path" (cannot move a value into itself)`)
		}
		return c, nil
	case OpAdd, OpReplace, OpTest, OpAppend:
		return c, c.decode(o.Value, maxValue)
	default:
		return c, fmt.Errorf("unknown op %q (want add, remove, replace, move, copy, test or append)", o.Op)
	}
}

func (c *compiledOp) decode(raw json.RawMessage, maxValue int) error {
	if raw == nil {
		return fmt.Errorf(`op %q needs member "value"`, c.kind)
	}
	if maxValue > 0 && len(raw) > maxValue {
		return fmt.Errorf("value is %d bytes, more than the limit of %d", len(raw), maxValue)
	}
	v, err := decodeValue(raw)
	if err != nil {
		return err
	}
	c.value = v
	if c.kind == OpTest {
		return nil
	}
	c.venc, err = encode(v)
	return err
}
