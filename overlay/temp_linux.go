//go:build linux

package overlay

import "os"

// Every pack and rollback record is written to a new temp file and renamed. Creating an inode
// is not always cheap: on a busy ext4 the allocator reads inode table blocks to skip recently
// deleted inodes, which measured 0.1-0.5 ms per create here. So the store keeps one empty temp
// file made in the background after each use, and the frozen window of a capture or a
// rollback only takes it. Leftover temp files are removed when a store is opened.

// tempFile returns an empty temp file in the store dir: the spare one, or a new one.
func (s *Store) tempFile() (*os.File, error) {
	var f *os.File
	select {
	case f = <-s.spare:
	default:
	}
	if f == nil {
		var err error
		if f, err = os.CreateTemp(s.dir, tempPrefix+"*"); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// prepareTemp makes the next spare temp file in the background. Capture, Rollback and Delete
// call it (with s.mu held) when they are done, so it never competes with their own I/O. One
// creation at a time: two calls in a row make one spare, not one and a discarded one.
func (s *Store) prepareTemp() {
	if len(s.spare) > 0 || !s.making.CompareAndSwap(false, true) {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer s.making.Store(false)
		f, err := os.CreateTemp(s.dir, tempPrefix+"*")
		if err != nil {
			return // the next write creates its own
		}
		select {
		case s.spare <- f:
		default:
			discardTemp(f)
		}
	}()
}

// dropSpare waits for background creation and removes the spare temp file.
func (s *Store) dropSpare() {
	s.bg.Wait()
	select {
	case f := <-s.spare:
		discardTemp(f)
	default:
	}
}

func discardTemp(f *os.File) {
	_ = f.Close()
	_ = os.Remove(f.Name())
}
