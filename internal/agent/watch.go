package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/yamux"
)

// watchBuffer is how many events the watcher holds while the host is slow
// to read them (beyond them, the kernel's own queue, then an overflow).
const watchBuffer = 1024

// opWatch reports the changes under a directory (OpWatch) until the host
// closes the stream: inotify through fsnotify, one watch per directory,
// subdirectories added as they are found (fsnotify has no recursive
// watches on Linux).
func (s *server) opWatch(st *yamux.Stream, req *agentproto.Request) *agentproto.Response {
	root, perr := cleanPath(req.Path)
	if perr != nil {
		return fail(perr)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return fail(fsError(root, err))
	}
	if !fi.IsDir() {
		return fail(errorf(agentproto.CodeNotDir, "%s is not a directory", root))
	}
	w, err := fsnotify.NewBufferedWatcher(watchBuffer)
	if err != nil {
		return fail(errorf(agentproto.CodeInternal, "watch %s: %v", root, err))
	}
	defer w.Close()
	wt := &watch{w: w, root: root, recursive: req.Recursive}
	if aerr := wt.add(root); aerr != nil {
		return fail(aerr)
	}
	if aerr := agentproto.WriteJSON(st, agentproto.KindResponse, &agentproto.Response{}); aerr != nil {
		return nil
	}
	// The host sends nothing more: a read that ends is the stream closed.
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			if _, _, err := agentproto.ReadFrame(st, nil); err != nil {
				return
			}
		}
	}()
	for {
		select {
		case <-gone:
			return nil
		case err := <-w.Errors:
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				return fail(errorf(agentproto.CodeTooLarge, "watch %s: more changes than the watch could keep up with", root))
			}
			return fail(errorf(agentproto.CodeInternal, "watch %s: %v", root, err))
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if wt.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					if aerr := wt.add(ev.Name); aerr != nil {
						return fail(aerr)
					}
				}
			}
			for _, e := range wt.events(ev) {
				// A removed subdirectory is reported by its parent's watch
				// and by its own: once.
				if e.Type == agentproto.EventRemove && e == wt.last {
					continue
				}
				wt.last = e
				if err := agentproto.WriteJSON(st, agentproto.KindData, &e); err != nil {
					return nil
				}
			}
			if ev.Name == root && ev.Has(fsnotify.Remove) || ev.Name == root && ev.Has(fsnotify.Rename) {
				_ = agentproto.WriteFrame(st, agentproto.KindEnd, nil)
				return nil
			}
		}
	}
}

// watch is one OpWatch's watcher and the directories it follows.
type watch struct {
	w         *fsnotify.Watcher
	root      string
	recursive bool
	dirs      int
	last      agentproto.WatchEvent // the last one sent
}

// add watches dir and, for a recursive watch, the directories under it
// (symlinks are not followed; a directory that cannot be read is left
// out).
func (wt *watch) add(dir string) *agentproto.Error {
	addOne := func(p string) *agentproto.Error {
		if wt.dirs >= agentproto.MaxWatchDirs {
			return errorf(agentproto.CodeTooLarge, "watch %s: more than %d directories", wt.root, agentproto.MaxWatchDirs)
		}
		if err := wt.w.Add(p); err != nil {
			if p == wt.root {
				return fsError(p, err)
			}
			return nil // gone meanwhile, or unreadable
		}
		wt.dirs++
		return nil
	}
	if !wt.recursive {
		return addOne(dir)
	}
	var aerr *agentproto.Error
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if aerr = addOne(p); aerr != nil {
			return filepath.SkipAll
		}
		return nil
	})
	return aerr
}

// events are the protocol's events of one fsnotify event (whose Op may
// hold several).
func (wt *watch) events(ev fsnotify.Event) []agentproto.WatchEvent {
	name, err := filepath.Rel(wt.root, ev.Name)
	if err != nil {
		name = ev.Name
	}
	var out []agentproto.WatchEvent
	for _, m := range []struct {
		op  fsnotify.Op
		typ string
	}{
		{fsnotify.Create, agentproto.EventCreate},
		{fsnotify.Write, agentproto.EventWrite},
		{fsnotify.Remove, agentproto.EventRemove},
		{fsnotify.Rename, agentproto.EventRename},
		{fsnotify.Chmod, agentproto.EventChmod},
	} {
		if ev.Has(m.op) {
			out = append(out, agentproto.WatchEvent{Type: m.typ, Name: name})
		}
	}
	return out
}
