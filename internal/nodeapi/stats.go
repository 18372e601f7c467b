package nodeapi

import "time"

// SandboxStats is one sample of a sandbox's host CPU use (Node.Stats). The
// fraction of its quota a sandbox used between two samples a and b is
//
//	(b.CPUUsageNs - a.CPUUsageNs) / ((b.SampledAt - a.SampledAt) × b.CPU)
//
// (SandboxStats.Fraction), both samples taken by the same node's clock.
type SandboxStats struct {
	// CPUUsageNs is the CPU time, in nanoseconds, that the sandbox's host
	// cgroup has used since the sandbox started (cumulative: gVisor's
	// Sentry, gofer and systrap stubs, or the namespaced process tree).
	// It starts again from zero when a paused sandbox resumes.
	CPUUsageNs int64
	// CPU is the CPU quota in force, in cores (0: none): the shape's, or
	// what Throttle set.
	CPU float64
	// SampledAt is when CPUUsageNs was read.
	SampledAt time.Time
}

// Fraction is the share of its CPU quota the sandbox used from prev to s
// (1: all of it), and false when it cannot be told: no quota, no time
// between the samples, or a counter that went back (a resume).
func (s SandboxStats) Fraction(prev SandboxStats) (float64, bool) {
	wall := s.SampledAt.Sub(prev.SampledAt)
	used := s.CPUUsageNs - prev.CPUUsageNs
	if s.CPU <= 0 || wall <= 0 || used < 0 {
		return 0, false
	}
	return float64(used) / (float64(wall) * s.CPU), true
}
