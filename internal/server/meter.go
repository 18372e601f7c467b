package server

import "context"

// teamStopper is the meter's meter.Stopper: the sandbox service's EndTeam,
// through a function since the service is made after the meter it uses.
type teamStopper func(ctx context.Context, teamID, reason string) (int, error)

func (f teamStopper) EndTeam(ctx context.Context, teamID, reason string) (int, error) {
	return f(ctx, teamID, reason)
}
