package main

import (
	"testing"

	"github.com/evalbox/evalbox/internal/cli"
	"github.com/evalbox/evalbox/internal/node"
	"github.com/evalbox/evalbox/internal/sandbox"
)

// TestServeDefaults holds the defaults `evalbox serve` shows in its help
// equal to those of the packages it configures.
func TestServeDefaults(t *testing.T) {
	if cli.DefaultPids != sandbox.DefaultPids {
		t.Errorf("cli.DefaultPids %d, sandbox.DefaultPids %d", cli.DefaultPids, sandbox.DefaultPids)
	}
	if cli.DefaultMemoryOvercommit != node.DefaultMemoryOvercommit {
		t.Errorf("cli.DefaultMemoryOvercommit %g, node.DefaultMemoryOvercommit %g", float64(cli.DefaultMemoryOvercommit), float64(node.DefaultMemoryOvercommit))
	}
}
