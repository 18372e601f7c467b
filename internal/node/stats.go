package node

import (
	"context"
	"fmt"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/pkg/client"
)

// cpuController returns the sandbox's runtime as a runtime.CPUController.
func (s *Sandbox) cpuController() (runtime.CPUController, error) {
	c, ok := s.runtime().(runtime.CPUController)
	if !ok {
		return nil, fmt.Errorf("node: the %s runtime cannot measure or limit a sandbox's CPU", s.Runtime)
	}
	return c, nil
}

// Stats samples a sandbox's host CPU use and quota (the CPU-abuse rule's
// measure): two files of its host cgroup, read without its agent.
func (l *Local) Stats(_ context.Context, id string) (nodeapi.SandboxStats, error) {
	sb, err := l.sandbox(id)
	if err != nil {
		return nodeapi.SandboxStats{}, err
	}
	c, err := sb.cpuController()
	if err != nil {
		return nodeapi.SandboxStats{}, err
	}
	used, err := c.CPUUsage()
	at := time.Now()
	if err != nil {
		return nodeapi.SandboxStats{}, fmt.Errorf("node: CPU usage of %s: %w", id, err)
	}
	cpu, err := c.CPULimit()
	if err != nil {
		return nodeapi.SandboxStats{}, fmt.Errorf("node: CPU limit of %s: %w", id, err)
	}
	return nodeapi.SandboxStats{CPUUsageNs: used.Nanoseconds(), CPU: cpu, SampledAt: at}, nil
}

// Throttle sets a running sandbox's CPU quota to cpu cores, at most its
// shape's (the CPU-abuse rule halves a long-running sandbox's). It holds
// the sandbox's op lock: a pause or resume in flight finishes first (a
// resume starts again from the shape's quota).
func (l *Local) Throttle(_ context.Context, id string, cpu float64) error {
	sb, err := l.n.liveSandbox(id)
	if err != nil {
		return err
	}
	if !(cpu > 0) || (sb.Shape.CPU > 0 && cpu > sb.Shape.CPU) {
		return &apierr.Error{Code: client.CodeBadRequest, Message: fmt.Sprintf("a throttle of sandbox %s must be in (0, %g] cores, got %g", id, sb.Shape.CPU, cpu)}
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if sb.paused.Load() {
		return errPaused(id)
	}
	c, err := sb.cpuController()
	if err != nil {
		return err
	}
	if err := c.SetCPULimit(cpu); err != nil {
		return fmt.Errorf("node: throttle %s: %w", id, err)
	}
	l.n.log.Info("sandbox throttled", "sandbox", id, "cpu", cpu, "shape_cpu", sb.Shape.CPU)
	return nil
}
