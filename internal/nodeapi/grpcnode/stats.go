package grpcnode

import (
	"context"

	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// The CPU-abuse rule's calls: Stats and Throttle, on both ends.

func (c *Client) Stats(ctx context.Context, id string) (nodeapi.SandboxStats, error) {
	resp, err := c.c.Stats(ctx, &pb.StatsRequest{SandboxId: id})
	if err != nil {
		return nodeapi.SandboxStats{}, fromStatus(ctx, "stats", err)
	}
	return nodeapi.SandboxStats{CPUUsageNs: resp.GetCpuUsageNs(), CPU: resp.GetCpu(), SampledAt: fromUnixNano(resp.GetSampledAtUnixNano())}, nil
}

func (c *Client) Throttle(ctx context.Context, id string, cpu float64) error {
	_, err := c.c.Throttle(ctx, &pb.ThrottleRequest{SandboxId: id, Cpu: cpu})
	return fromStatus(ctx, "throttle", err)
}

func (s *server) Stats(ctx context.Context, req *pb.StatsRequest) (*pb.SandboxStats, error) {
	st, err := s.n.Stats(ctx, req.GetSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.SandboxStats{CpuUsageNs: st.CPUUsageNs, Cpu: st.CPU, SampledAtUnixNano: unixNano(st.SampledAt)}, nil
}

func (s *server) Throttle(ctx context.Context, req *pb.ThrottleRequest) (*pb.ThrottleResponse, error) {
	if err := s.n.Throttle(ctx, req.GetSandboxId(), req.GetCpu()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ThrottleResponse{}, nil
}
