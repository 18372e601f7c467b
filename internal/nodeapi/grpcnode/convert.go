package grpcnode

import (
	"time"

	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// The conversions between the contract's Go types and their wire form, one
// pair per message. Times travel as Unix nanoseconds (0: the zero time),
// durations as nanoseconds.

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func pbShape(s nodeapi.Shape) *pb.Shape {
	return &pb.Shape{Cpu: s.CPU, MemoryMb: int64(s.MemoryMB), DiskMb: int64(s.DiskMB), Pids: int64(s.Pids), Network: s.Network}
}

func shape(s *pb.Shape) nodeapi.Shape {
	return nodeapi.Shape{CPU: s.GetCpu(), MemoryMB: int(s.GetMemoryMb()), DiskMB: int(s.GetDiskMb()), Pids: int(s.GetPids()), Network: s.GetNetwork()}
}

func pbSpec(s nodeapi.Spec) *pb.Spec {
	return &pb.Spec{Template: s.Template, Runtime: s.Runtime, Shape: pbShape(s.Shape)}
}

func spec(s *pb.Spec) nodeapi.Spec {
	return nodeapi.Spec{Template: s.GetTemplate(), Runtime: s.GetRuntime(), Shape: shape(s.GetShape())}
}

func pbResources(r nodeapi.Resources) *pb.Resources {
	return &pb.Resources{Pids: r.Pids, MemoryBytes: r.MemoryBytes}
}

func resources(r *pb.Resources) nodeapi.Resources {
	return nodeapi.Resources{Pids: r.GetPids(), MemoryBytes: r.GetMemoryBytes()}
}

func pbCapacity(c nodeapi.CapacityStatus) *pb.CapacityStatus {
	return &pb.CapacityStatus{Budget: pbResources(c.Budget), Reserved: pbResources(c.Reserved),
		MemoryAvailable: c.MemoryAvailable, MemoryReserve: c.MemoryReserve,
		Sandboxes: int64(c.Sandboxes), Waiting: int64(c.Waiting)}
}

func capacity(c *pb.CapacityStatus) nodeapi.CapacityStatus {
	return nodeapi.CapacityStatus{Budget: resources(c.GetBudget()), Reserved: resources(c.GetReserved()),
		MemoryAvailable: c.GetMemoryAvailable(), MemoryReserve: c.GetMemoryReserve(),
		Sandboxes: int(c.GetSandboxes()), Waiting: int(c.GetWaiting())}
}

func pbPoolStatus(p nodeapi.PoolStatus) *pb.PoolStatus {
	return &pb.PoolStatus{Spec: pbSpec(p.Spec), TemplateName: p.TemplateName, Target: int64(p.Target), Ready: int64(p.Ready)}
}

func poolStatus(p *pb.PoolStatus) nodeapi.PoolStatus {
	return nodeapi.PoolStatus{Spec: spec(p.GetSpec()), TemplateName: p.GetTemplateName(), Target: int(p.GetTarget()), Ready: int(p.GetReady())}
}

func pbSandboxInfo(s nodeapi.SandboxInfo) *pb.SandboxInfo {
	return &pb.SandboxInfo{Id: s.ID, Runtime: s.Runtime, RuntimeVersion: s.RuntimeVersion,
		StartedAtUnixNano: unixNano(s.StartedAt), FromPool: s.FromPool, EgressApplied: s.EgressApplied}
}

func sandboxInfo(s *pb.SandboxInfo) nodeapi.SandboxInfo {
	return nodeapi.SandboxInfo{ID: s.GetId(), Runtime: s.GetRuntime(), RuntimeVersion: s.GetRuntimeVersion(),
		StartedAt: fromUnixNano(s.GetStartedAtUnixNano()), FromPool: s.GetFromPool(), EgressApplied: s.GetEgressApplied()}
}

func pbExecRequest(r nodeapi.ExecRequest) *pb.ExecRequest {
	return &pb.ExecRequest{Argv: r.Argv, Shell: r.Shell, Cwd: r.Cwd, Env: r.Env, User: r.User, Stdin: r.Stdin,
		TimeoutMs: r.TimeoutMs, MaxOutputBytes: r.MaxOutputBytes, Tag: r.Tag,
		KillOnOutputLimit: r.KillOnOutputLimit, MemoryLimitBytes: r.MemoryLimitBytes}
}

func execRequest(r *pb.ExecRequest) nodeapi.ExecRequest {
	return nodeapi.ExecRequest{Argv: r.GetArgv(), Shell: r.GetShell(), Cwd: r.GetCwd(), Env: r.GetEnv(), User: r.GetUser(),
		Stdin: r.GetStdin(), TimeoutMs: r.GetTimeoutMs(), MaxOutputBytes: r.GetMaxOutputBytes(), Tag: r.GetTag(),
		KillOnOutputLimit: r.GetKillOnOutputLimit(), MemoryLimitBytes: r.GetMemoryLimitBytes()}
}

func pbExit(x nodeapi.ExitInfo) *pb.ExitInfo {
	return &pb.ExitInfo{Status: x.Status, ExitCode: int64(x.ExitCode), Signal: int64(x.Signal), DurationMs: x.DurationMs,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated, Error: x.Error, OomKills: x.OOMKills,
		OutputLimitExceeded: x.OutputLimitExceeded, MemoryLimitExceeded: x.MemoryLimitExceeded, PeakMemoryBytes: x.PeakMemoryBytes}
}

func exit(x *pb.ExitInfo) nodeapi.ExitInfo {
	return nodeapi.ExitInfo{Status: x.GetStatus(), ExitCode: int(x.GetExitCode()), Signal: int(x.GetSignal()), DurationMs: x.GetDurationMs(),
		StdoutTruncated: x.GetStdoutTruncated(), StderrTruncated: x.GetStderrTruncated(), Error: x.GetError(), OOMKills: x.GetOomKills(),
		OutputLimitExceeded: x.GetOutputLimitExceeded(), MemoryLimitExceeded: x.GetMemoryLimitExceeded(), PeakMemoryBytes: x.GetPeakMemoryBytes()}
}

func pbProc(p nodeapi.ProcInfo) *pb.ProcInfo {
	out := &pb.ProcInfo{Id: p.ID, Pid: int64(p.Pid), Argv: p.Argv, Tag: p.Tag, StartedAtUnixNano: unixNano(p.StartedAt), Running: p.Running}
	if p.Exit != nil {
		out.Exit = pbExit(*p.Exit)
	}
	return out
}

func proc(p *pb.ProcInfo) nodeapi.ProcInfo {
	out := nodeapi.ProcInfo{ID: p.GetId(), Pid: int(p.GetPid()), Argv: p.GetArgv(), Tag: p.GetTag(),
		StartedAt: fromUnixNano(p.GetStartedAtUnixNano()), Running: p.GetRunning()}
	if p.GetExit() != nil {
		x := exit(p.GetExit())
		out.Exit = &x
	}
	return out
}

func pbFile(f nodeapi.FileInfo) *pb.FileInfo {
	return &pb.FileInfo{Name: f.Name, Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode,
		ModTimeUnixNano: unixNano(f.ModTime), Target: f.Target}
}

func file(f *pb.FileInfo) nodeapi.FileInfo {
	return nodeapi.FileInfo{Name: f.GetName(), Path: f.GetPath(), Type: f.GetType(), Size: f.GetSize(), Mode: f.GetMode(),
		ModTime: fromUnixNano(f.GetModTimeUnixNano()), Target: f.GetTarget()}
}

// egress and pbEgress convert egress rules (nil: none).
func egress(e *pb.Egress) *nodeapi.Egress {
	if e == nil {
		return nil
	}
	return &nodeapi.Egress{Allow: e.GetAllow(), Deny: e.GetDeny()}
}

func pbEgress(e *nodeapi.Egress) *pb.Egress {
	if e == nil {
		return nil
	}
	return &pb.Egress{Allow: e.Allow, Deny: e.Deny}
}

func pbSnapshotInfo(s nodeapi.SnapshotInfo) *pb.SnapshotInfo {
	return &pb.SnapshotInfo{Id: s.ID, Source: s.Source, Spec: pbSpec(s.Spec), RuntimeVersion: s.RuntimeVersion,
		Memory: s.Memory, SizeBytes: s.SizeBytes, CreatedAtUnixNano: s.CreatedAt.UnixNano()}
}

func snapshotInfo(s *pb.SnapshotInfo) nodeapi.SnapshotInfo {
	return nodeapi.SnapshotInfo{ID: s.GetId(), Source: s.GetSource(), Spec: spec(s.GetSpec()), RuntimeVersion: s.GetRuntimeVersion(),
		Memory: s.GetMemory(), SizeBytes: s.GetSizeBytes(), CreatedAt: time.Unix(0, s.GetCreatedAtUnixNano()).UTC()}
}
