package e2b

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/evalbox/evalbox/internal/compat/e2b/envdpb/processpb"
	"github.com/evalbox/evalbox/pkg/client"
)

// processService is envd's process.Process on evalbox's background
// processes: a process the SDK starts lives on when its stream ends (a
// timeout, a dropped connection), as under envd, and Connect attaches to it
// again, its output replayed from the start.
type processService struct {
	h *Handler
}

// keepaliveHeader is the SDKs' keepalive interval, in seconds, for streams
// that may stay quiet.
const keepaliveHeader = "Keepalive-Ping-Interval"

func (s *processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], st *connect.ServerStream[processpb.StartResponse]) error {
	c := callOf(ctx)
	m := req.Msg
	if m.Pty != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("evalbox has no PTY processes yet"))
	}
	cfg := m.GetProcess()
	if cfg == nil || cfg.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	ereq := client.ExecRequest{Argv: append([]string{cfg.Cmd}, cfg.Args...), Env: cfg.Envs, User: c.user, Tag: m.GetTag(),
		KeepStdin: m.GetStdin()}
	if cfg.Cwd != nil {
		ereq.Cwd = *cfg.Cwd
	}
	proc, err := s.h.cfg.Sandboxes.StartProcess(ctx, c.team, c.id, ereq)
	if err != nil {
		return connectError(err)
	}
	send := func(ev *processpb.ProcessEvent) error { return st.Send(&processpb.StartResponse{Event: ev}) }
	return s.follow(ctx, req.Header().Get(keepaliveHeader), proc, send)
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], st *connect.ServerStream[processpb.ConnectResponse]) error {
	proc, err := s.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	send := func(ev *processpb.ProcessEvent) error { return st.Send(&processpb.ConnectResponse{Event: ev}) }
	return s.follow(ctx, req.Header().Get(keepaliveHeader), proc, send)
}

// follow sends proc's start event, its output as it comes, keepalives
// while it is quiet, and its end.
func (s *processService) follow(ctx context.Context, keepalive string, proc client.Process, send func(*processpb.ProcessEvent) error) error {
	c := callOf(ctx)
	var (
		mu      sync.Mutex
		sendErr error
	)
	emit := func(ev *processpb.ProcessEvent) {
		mu.Lock()
		defer mu.Unlock()
		if sendErr == nil {
			sendErr = send(ev)
		}
	}
	emit(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(proc.Pid)}}})
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	if secs, err := strconv.Atoi(keepalive); err == nil && secs > 0 {
		t := time.NewTicker(time.Duration(secs) * time.Second)
		defer t.Stop()
		go func() {
			for {
				select {
				case <-actx.Done():
					return
				case <-t.C:
					emit(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}})
				}
			}
		}()
	}
	out := eventWriter{emit: emit, stdout: true, cancel: cancel, err: func() error { mu.Lock(); defer mu.Unlock(); return sendErr }}
	errw := out
	errw.stdout = false
	res, err := s.h.cfg.Sandboxes.AttachProcess(actx, c.team, c.id, proc.ID, out, errw)
	cancel()
	if e := out.err(); e != nil {
		return e // the client is gone
	}
	if err != nil {
		if ctx.Err() != nil {
			return connectError(ctx.Err())
		}
		return connectError(err)
	}
	emit(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: endEvent(res)}})
	return out.err()
}

// eventWriter turns an output stream into data events.
type eventWriter struct {
	emit   func(*processpb.ProcessEvent)
	stdout bool
	cancel func()
	err    func() error
}

func (w eventWriter) Write(p []byte) (int, error) {
	d := &processpb.ProcessEvent_DataEvent{}
	b := append([]byte(nil), p...)
	if w.stdout {
		d.Output = &processpb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	} else {
		d.Output = &processpb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	}
	w.emit(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}})
	if err := w.err(); err != nil {
		w.cancel()
		return 0, err
	}
	return len(p), nil
}

// endEvent is res as envd's end event, its status worded as Go's
// ProcessState, as envd words it.
func endEvent(res client.ExecResult) *processpb.ProcessEvent_EndEvent {
	end := &processpb.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode)}
	switch {
	case res.Status == client.StatusExited:
		end.Exited = true
		end.Status = fmt.Sprintf("exit status %d", res.ExitCode)
	case res.Signal != 0:
		end.ExitCode = -1
		end.Status = "signal: " + signalName(res.Signal)
	default:
		end.ExitCode = -1
		end.Status = res.Status
	}
	if res.Error != "" {
		end.Error = &res.Error
	} else if end.ExitCode != 0 {
		end.Error = &end.Status
	}
	return end
}

func signalName(sig int) string {
	switch sig {
	case 9:
		return "killed"
	case 15:
		return "terminated"
	case 2:
		return "interrupt"
	case 6:
		return "aborted"
	case 11:
		return "segmentation fault"
	}
	return "signal " + strconv.Itoa(sig)
}

// find returns the process a selector names: by its pid in the sandbox
// or its tag, the newest first.
func (s *processService) find(ctx context.Context, sel *processpb.ProcessSelector) (client.Process, error) {
	c := callOf(ctx)
	if sel == nil || sel.Selector == nil {
		return client.Process{}, connect.NewError(connect.CodeInvalidArgument, errors.New("process: give a pid or a tag"))
	}
	procs, err := s.h.cfg.Sandboxes.ListProcesses(ctx, c.team, c.id)
	if err != nil {
		return client.Process{}, connectError(err)
	}
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		switch v := sel.Selector.(type) {
		case *processpb.ProcessSelector_Pid:
			if uint32(p.Pid) == v.Pid {
				return p, nil
			}
		case *processpb.ProcessSelector_Tag:
			if p.Tag != "" && p.Tag == v.Tag {
				return p, nil
			}
		}
	}
	return client.Process{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found", selectorString(sel)))
}

func selectorString(sel *processpb.ProcessSelector) string {
	if t, ok := sel.Selector.(*processpb.ProcessSelector_Tag); ok {
		return "tag " + strconv.Quote(t.Tag)
	}
	return "pid " + strconv.Itoa(int(sel.GetPid()))
}

func (s *processService) List(ctx context.Context, _ *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	c := callOf(ctx)
	procs, err := s.h.cfg.Sandboxes.ListProcesses(ctx, c.team, c.id)
	if err != nil {
		return nil, connectError(err)
	}
	out := &processpb.ListResponse{}
	for _, p := range procs {
		if !p.Running {
			continue
		}
		info := &processpb.ProcessInfo{Pid: uint32(p.Pid), Config: &processpb.ProcessConfig{}}
		if len(p.Argv) > 0 {
			info.Config.Cmd, info.Config.Args = p.Argv[0], p.Argv[1:]
		}
		if p.Tag != "" {
			info.Tag = &p.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	var sig string
	switch req.Msg.Signal {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case processpb.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: want SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.Signal))
	}
	proc, err := s.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if !proc.Running {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d already ended", proc.Pid))
	}
	c := callOf(ctx)
	if err := s.h.cfg.Sandboxes.SignalProcess(ctx, c.team, c.id, proc.ID, sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

func (s *processService) Update(context.Context, *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("evalbox has no PTY processes yet"))
}

// StreamInput writes a stream of input messages to one process's stdin,
// in order: a start naming the process, then data (and keepalives).
func (s *processService) StreamInput(ctx context.Context, st *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var proc *client.Process
	for st.Receive() {
		switch ev := st.Msg().Event.(type) {
		case *processpb.StreamInputRequest_Start:
			if proc != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a second start event"))
			}
			p, err := s.find(ctx, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			proc = &p
		case *processpb.StreamInputRequest_Data:
			if proc == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before the start event"))
			}
			if err := s.write(ctx, *proc, ev.Data.GetInput(), false); err != nil {
				return nil, err
			}
		case *processpb.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("an empty event"))
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	proc, err := s.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.write(ctx, proc, req.Msg.GetInput(), false); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	proc, err := s.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.write(ctx, proc, nil, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

// write sends input to proc's stdin (in pieces of at most
// sandbox.MaxStdinBytes), then closes it if closeAfter.
func (s *processService) write(ctx context.Context, proc client.Process, in *processpb.ProcessInput, closeAfter bool) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *processpb.ProcessInput_Stdin:
		data = v.Stdin
	case *processpb.ProcessInput_Pty:
		return connect.NewError(connect.CodeUnimplemented, errors.New("evalbox has no PTY processes yet"))
	case nil:
		if !closeAfter {
			return connect.NewError(connect.CodeInvalidArgument, errors.New("input: give stdin"))
		}
	}
	c := callOf(ctx)
	for {
		n := min(len(data), maxStdinChunk)
		last := n == len(data)
		if err := s.h.cfg.Sandboxes.WriteStdin(ctx, c.team, c.id, proc.ID, data[:n], closeAfter && last); err != nil {
			return connectError(err)
		}
		if data = data[n:]; last {
			return nil
		}
	}
}

// maxStdinChunk is the most input one write to the node carries.
const maxStdinChunk = 1 << 20
