package sandbox

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/pkg/client"
)

// MaxWatches is how many directory watches one sandbox has open at once.
const MaxWatches = 16

// DirWatch is a watch of a sandbox's directory (Service.WatchDir).
type DirWatch struct {
	s      *Service
	e      *entry
	w      nodeapi.DirWatch
	cancel context.CancelFunc
	once   sync.Once
}

// WatchDir watches a directory of the sandbox (with recursive, the
// directories under it too, at most nodeapi.MaxWatchDirs) and returns once
// the watch is set up. It lasts until Close, ctx ends or the sandbox ends.
func (s *Service) WatchDir(ctx context.Context, teamID, id, path string, recursive bool) (*DirWatch, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	e, err := s.lookup(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	if n := e.watches.Add(1); n > MaxWatches {
		e.watches.Add(-1)
		return nil, errorf(client.CodeRateLimited, "sandbox %s has %d directory watches open: at most %d", id, n-1, MaxWatches)
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.life, cancel)
	w, err := s.node.WatchDir(wctx, e.row.ID, path, recursive)
	if err != nil {
		stop()
		cancel()
		e.watches.Add(-1)
		return nil, s.callErr(e, err)
	}
	return &DirWatch{s: s, e: e, w: w, cancel: func() { stop(); cancel() }}, nil
}

// Next returns the next change; io.EOF once the watched directory itself
// is gone.
func (d *DirWatch) Next() (client.WatchEvent, error) {
	ev, err := d.w.Next()
	if err == io.EOF {
		return client.WatchEvent{}, io.EOF
	}
	if err != nil {
		return client.WatchEvent{}, d.s.callErr(d.e, err)
	}
	return client.WatchEvent{Type: ev.Type, Name: ev.Name}, nil
}

// Close ends the watch.
func (d *DirWatch) Close() {
	d.once.Do(func() {
		d.w.Close()
		d.cancel()
		d.e.watches.Add(-1)
	})
}

// Follow sends the watch's changes to fn, and a WatchKeepalive event after
// every keepalive without one, until the watched directory goes (nil),
// ctx ends (nil), the watch fails or fn does (that error).
func (d *DirWatch) Follow(ctx context.Context, keepalive time.Duration, fn func(client.WatchEvent) error) error {
	type next struct {
		ev  client.WatchEvent
		err error
	}
	events := make(chan next)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			ev, err := d.Next()
			select {
			case events <- next{ev, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := fn(client.WatchEvent{Type: client.WatchKeepalive}); err != nil {
				return err
			}
		case n := <-events:
			if errors.Is(n.err, io.EOF) {
				return nil
			}
			if n.err != nil {
				return n.err
			}
			if err := fn(n.ev); err != nil {
				return err
			}
			tick.Reset(keepalive)
		}
	}
}
