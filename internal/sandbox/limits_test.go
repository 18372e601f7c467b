package sandbox

import (
	"testing"

	"github.com/evalbox/evalbox/internal/limits"
)

// TestLimitsTable holds the service's defaults equal to internal/limits'
// table (docs/limits.md).
func TestLimitsTable(t *testing.T) {
	var c Config
	c.setDefaults()
	for _, x := range []struct {
		name      string
		got, want any
	}{
		{"default_timeout", c.DefaultTimeout, limits.DefaultTimeout},
		{"max_timeout", c.MaxTimeout, limits.MaxTimeout},
		{"max_cpu", c.MaxCPU, float64(limits.MaxCPU)},
		{"max_memory_mb", c.MaxMemoryMB, limits.MaxMemoryMB},
		{"max_disk_mb", c.MaxDiskMB, limits.MaxDiskMB},
		{"pids", c.Pids, limits.Pids},
		{"max_create_wait", c.MaxWait, limits.MaxCreateWait},
		{"exec_wait", c.ExecWait, limits.ExecWait},
		{"max_output_bytes", c.MaxOutputBytes, int64(limits.MaxOutputBytes)},
		{"max_output_limit", c.MaxOutputLimit, int64(limits.MaxOutputLimit)},
		{"max_file_bytes", c.MaxFileBytes, int64(limits.MaxFileBytes)},
	} {
		if x.got != x.want {
			t.Errorf("%s: the service's %v, internal/limits' %v", x.name, x.got, x.want)
		}
	}
}
