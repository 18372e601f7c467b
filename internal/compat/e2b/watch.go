package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/evalbox/evalbox/internal/compat/e2b/envdpb/filesystempb"
	"github.com/evalbox/evalbox/pkg/client"
)

// Watcher is a watch of a sandbox's directory (sandbox.DirWatch).
type Watcher interface {
	Next() (client.WatchEvent, error)
	Follow(ctx context.Context, keepalive time.Duration, fn func(client.WatchEvent) error) error
	Close()
}

// envd's watches, on evalbox's (Config.Watch): WatchDir streams them (the
// async SDKs' files.watch_dir); CreateWatcher, GetWatcherEvents and
// RemoveWatcher keep one on the server for a client that polls it (the
// sync SDK's WatchHandle). include_entry (envd 0.6.3) is not advertised,
// so the SDKs do not send it.

// watchKeepalive is how often a quiet WatchDir stream sends a keepalive.
const watchKeepalive = 15 * time.Second

var eventTypes = map[string]filesystempb.EventType{
	client.WatchCreate: filesystempb.EventType_EVENT_TYPE_CREATE,
	client.WatchWrite:  filesystempb.EventType_EVENT_TYPE_WRITE,
	client.WatchRemove: filesystempb.EventType_EVENT_TYPE_REMOVE,
	client.WatchRename: filesystempb.EventType_EVENT_TYPE_RENAME,
	client.WatchChmod:  filesystempb.EventType_EVENT_TYPE_CHMOD,
}

func fsEvent(ev client.WatchEvent) *filesystempb.FilesystemEvent {
	return &filesystempb.FilesystemEvent{Name: ev.Name, Type: eventTypes[ev.Type]}
}

// openWatch checks a watch request and opens the watch.
func (s *filesystemService) openWatch(ctx context.Context, path string, recursive, includeEntry, networkMounts bool) (Watcher, error) {
	if s.h.cfg.Watch == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server has no directory watches"))
	}
	if includeEntry || networkMounts {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("include_entry and allow_network_mounts: evalbox's envd is 0.5.7"))
	}
	c := callOf(ctx)
	w, err := s.h.cfg.Watch(ctx, c.team, c.id, path, recursive)
	if err != nil {
		return nil, fsError(err)
	}
	return w, nil
}

// WatchDir streams the changes: start once watching, then the events and
// keepalives; the stream ends when the directory goes or the client leaves.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystempb.WatchDirRequest], st *connect.ServerStream[filesystempb.WatchDirResponse]) error {
	w, err := s.openWatch(ctx, req.Msg.Path, req.Msg.Recursive, req.Msg.IncludeEntry, req.Msg.AllowNetworkMounts)
	if err != nil {
		return err
	}
	defer w.Close()
	if err := st.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Start{Start: &filesystempb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	err = w.Follow(ctx, watchKeepalive, func(ev client.WatchEvent) error {
		m := &filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Filesystem{Filesystem: fsEvent(ev)}}
		if ev.Type == client.WatchKeepalive {
			m = &filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Keepalive{Keepalive: &filesystempb.WatchDirResponse_KeepAlive{}}}
		}
		return st.Send(m)
	})
	if err != nil && ctx.Err() == nil {
		return fsError(err)
	}
	return nil
}

// Polled watchers: their events wait for the client's next poll, at most
// maxPolledEvents of them; one not polled for polledIdle is removed.
const (
	maxPolledEvents = 10_000
	polledIdle      = 10 * time.Minute
)

type polledWatch struct {
	team, sandbox string
	w             Watcher

	mu       sync.Mutex
	events   []*filesystempb.FilesystemEvent
	err      error // how the watch ended (io.EOF: its directory went)
	lastPoll time.Time
}

// watchers holds the polled watchers by id.
type watchers struct {
	mu sync.Mutex
	m  map[string]*polledWatch
}

// add keeps p and removes the watchers nobody polled for polledIdle.
func (ws *watchers) add(id string, p *polledWatch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil {
		ws.m = map[string]*polledWatch{}
	}
	for k, o := range ws.m {
		o.mu.Lock()
		idle := time.Since(o.lastPoll) > polledIdle
		o.mu.Unlock()
		if idle {
			o.w.Close()
			delete(ws.m, k)
		}
	}
	ws.m[id] = p
}

// get returns the team's watcher of the sandbox; remove also forgets it.
func (ws *watchers) get(id, team, sandbox string, remove bool) (*polledWatch, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	p, ok := ws.m[id]
	if !ok || p.team != team || p.sandbox != sandbox {
		return nil, false
	}
	if remove {
		delete(ws.m, id)
	}
	return p, true
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystempb.CreateWatcherRequest]) (*connect.Response[filesystempb.CreateWatcherResponse], error) {
	// The watch outlives this request: until RemoveWatcher, its sandbox's
	// end, or polledIdle without a poll.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := s.openWatch(wctx, req.Msg.Path, req.Msg.Recursive, req.Msg.IncludeEntry, req.Msg.AllowNetworkMounts)
	if err != nil {
		cancel()
		return nil, err
	}
	c := callOf(ctx)
	p := &polledWatch{team: c.team, sandbox: c.id, w: closeAlso{w, cancel}, lastPoll: time.Now()}
	var b [12]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s.h.watchers.add(id, p)
	go func() {
		for {
			ev, err := w.Next()
			p.mu.Lock()
			switch {
			case err != nil:
				p.err = err
			case len(p.events) >= maxPolledEvents:
				p.err = fmt.Errorf("%w: more than %d events between two polls", errOverflow, maxPolledEvents)
			default:
				p.events = append(p.events, fsEvent(ev))
			}
			ended := p.err != nil
			p.mu.Unlock()
			if ended {
				p.w.Close()
				return
			}
		}
	}()
	return connect.NewResponse(&filesystempb.CreateWatcherResponse{WatcherId: id}), nil
}

var errOverflow = errors.New("watch overflowed")

// closeAlso is a Watcher whose Close also cancels its context.
type closeAlso struct {
	Watcher
	cancel context.CancelFunc
}

func (c closeAlso) Close() {
	c.Watcher.Close()
	c.cancel()
}

// GetWatcherEvents returns the events since the last poll; once they are
// read, a watch that failed answers its error (and is forgotten), one whose
// directory went answers no more events.
func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystempb.GetWatcherEventsRequest]) (*connect.Response[filesystempb.GetWatcherEventsResponse], error) {
	c := callOf(ctx)
	p, ok := s.h.watchers.get(req.Msg.WatcherId, c.team, c.id, false)
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.WatcherId))
	}
	p.mu.Lock()
	events, err := p.events, p.err
	p.events, p.lastPoll = nil, time.Now()
	p.mu.Unlock()
	if len(events) == 0 && err != nil && !errors.Is(err, io.EOF) {
		s.h.watchers.get(req.Msg.WatcherId, c.team, c.id, true)
		p.w.Close()
		if errors.Is(err, errOverflow) {
			return nil, connect.NewError(connect.CodeResourceExhausted, err)
		}
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.GetWatcherEventsResponse{Events: events}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystempb.RemoveWatcherRequest]) (*connect.Response[filesystempb.RemoveWatcherResponse], error) {
	c := callOf(ctx)
	p, ok := s.h.watchers.get(req.Msg.WatcherId, c.team, c.id, true)
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.WatcherId))
	}
	p.w.Close()
	return connect.NewResponse(&filesystempb.RemoveWatcherResponse{}), nil
}
