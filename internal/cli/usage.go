package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/evalbox/evalbox/pkg/client"
)

func newTariffsCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "tariffs",
		Short: "List and manage tariffs: sandbox shapes and their prices per second",
	})
	var listJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the tariffs",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := a.client().ListTariffs(cmd.Context())
			if err != nil {
				return err
			}
			if listJSON {
				if ts == nil {
					ts = []client.Tariff{}
				}
				return printJSON(out(cmd), client.TariffList{Tariffs: ts})
			}
			t := newTable(out(cmd), "NAME", "CPU", "MEMORY_MB", "DISK_MB", "PER_VCPU_S", "PER_GIB_S", "PER_DISK_GIB_S")
			for _, tf := range ts {
				t.row(tf.Name, strconv.FormatFloat(tf.CPU, 'g', -1, 64), strconv.Itoa(tf.MemoryMB), strconv.Itoa(tf.DiskMB),
					tf.PriceVCPUSecond, tf.PriceGiBSecond, tf.PriceDiskGiBSecond)
			}
			return t.flush()
		},
	}
	ls.Flags().BoolVar(&listJSON, "json", false, "print the list as JSON")

	var (
		req         client.PutTariffRequest
		abuseTh     float64
		abuseWindow seconds
	)
	set := &cobra.Command{
		Use:   "set NAME --cpu N --memory-mb N --disk-mb N --price-vcpu-second P --price-gib-second P --price-disk-gib-second P",
		Short: "Create or replace a tariff (admin key); sandboxes keep the prices they were created with",
		Example: `  evalbox tariffs set xlarge --cpu 8 --memory-mb 16384 --disk-mb 20480 \
    --price-vcpu-second 0.000014 --price-gib-second 0.0000045 --price-disk-gib-second 0.00000004`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			if cmd.Flags().Changed("cpu-abuse-threshold") {
				req.CPUAbuseThreshold = &abuseTh
			}
			if cmd.Flags().Changed("cpu-abuse-window") {
				w := time.Duration(abuseWindow).Seconds()
				req.CPUAbuseWindowSeconds = &w
			}
			t, err := a.client().PutTariff(cmd.Context(), names[0], req)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(out(cmd), t.Name)
			return err
		},
	}
	f := set.Flags()
	f.Float64Var(&req.CPU, "cpu", 0, "vCPUs")
	f.IntVar(&req.MemoryMB, "memory-mb", 0, "memory in MiB")
	f.IntVar(&req.DiskMB, "disk-mb", 0, "writable disk in MiB")
	f.StringVar(&req.PriceVCPUSecond, "price-vcpu-second", "0", "price of a vCPU-second (a decimal)")
	f.StringVar(&req.PriceGiBSecond, "price-gib-second", "0", "price of a GiB of memory for a second")
	f.StringVar(&req.PriceDiskGiBSecond, "price-disk-gib-second", "0", "price of a GiB of disk for a second (all a paused sandbox pays)")
	f.Float64Var(&abuseTh, "cpu-abuse-threshold", 0, "the CPU-abuse rule's threshold for its sandboxes (default: the server's)")
	f.Var(&abuseWindow, "cpu-abuse-window", "the CPU-abuse rule's window for its sandboxes (0: none; default: the server's)")

	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete tariffs (admin key); their sandboxes keep their prices",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			for _, n := range names {
				if err := a.client().DeleteTariff(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(ls, set, rm)
	return cmd
}

func newUsageCmd(a *app) *cobra.Command {
	var (
		o          client.UsageOptions
		from, to   string
		since      seconds
		asJSON     bool
		allTeams   bool
		teamFilter string
	)
	cmd := &cobra.Command{
		Use:   "usage [--from T] [--to T | --since D] [--group-by G] [--team ID | --all-teams] [--json]",
		Short: "Show metered usage and its cost, grouped by tariff, sandbox, template, day or eval run",
		Long: `Show the team's metered usage in a window (default the last 30 days): per
second from start to end, running time billed at least the server's minimum,
paused time priced for disk only, at each sandbox's tariff.`,
		Example: `  evalbox usage --since 24h --group-by template
  evalbox usage --from 2026-12-01T00:00:00Z --group-by day --json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if from != "" {
				if o.From, err = time.Parse(time.RFC3339, from); err != nil {
					return usagef(cmd, "--from: want an RFC 3339 time (2026-12-01T00:00:00Z), got %q", from)
				}
			}
			if to != "" {
				if o.To, err = time.Parse(time.RFC3339, to); err != nil {
					return usagef(cmd, "--to: want an RFC 3339 time, got %q", to)
				}
			}
			if since != 0 {
				if from != "" {
					return usagef(cmd, "--since and --from are exclusive")
				}
				end := o.To
				if end.IsZero() {
					end = time.Now()
				}
				o.From = end.Add(-time.Duration(since))
			}
			o.Team = teamFilter
			if allTeams {
				o.Team = "all"
			}
			r, err := a.client().Usage(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), r)
			}
			t := newTable(out(cmd), "KEY", "SANDBOXES", "RUNNING_S", "PAUSED_S", "BILLED_S", "VCPU_S", "GIB_S", "COST")
			line := func(l client.UsageLine, key string) {
				t.row(key, strconv.Itoa(l.Sandboxes), sec(l.RunningSeconds), sec(l.PausedSeconds), sec(l.BilledSeconds),
					sec(l.VCPUSeconds), sec(l.GiBSeconds), l.Cost)
			}
			for _, l := range r.Groups {
				line(l, orDash(l.Key))
			}
			line(r.Total, "TOTAL")
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "start of the window (RFC 3339; default 30 days before --to)")
	f.StringVar(&to, "to", "", "end of the window (RFC 3339; default now)")
	f.Var(&since, "since", "the window is this long, up to --to (seconds or a duration, e.g. 24h)")
	f.StringVar(&o.GroupBy, "group-by", "tariff", "sandbox, template, tariff, day or eval_run")
	f.StringVar(&teamFilter, "team", "", "another team's usage (admin key)")
	f.BoolVar(&allTeams, "all-teams", false, "every team's usage (admin key)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func sec(s float64) string { return strconv.FormatFloat(s, 'f', 1, 64) }

func newBalanceCmd(a *app) *cobra.Command {
	var (
		team   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "balance [--team ID] [--json]",
		Short: "Show the team's prepaid balance (top-ups, adjustments, charges)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := a.client().Balance(cmd.Context(), team)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), b)
			}
			t := newTable(out(cmd), "TEAM", "BALANCE", "LEDGER", "RUNNING", "BILLING", "WARNED")
			warned := "-"
			if b.WarnedAt != nil {
				warned = timeCell(*b.WarnedAt)
			}
			billing := "off"
			if b.Billing {
				billing = "on"
			}
			t.row(b.TeamID, b.Balance, b.Ledger, b.Running, billing, warned)
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "another team's balance (admin key)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the balance as JSON")

	var (
		note   string
		adjust bool
	)
	topUp := &cobra.Command{
		Use:   "top-up TEAM_ID AMOUNT [--note TEXT] [--adjust]",
		Short: "Top up a team's balance (admin key); --adjust for a correction, which may be negative",
		Example: `  evalbox balance top-up team_abc 100 --note "December"
  evalbox balance top-up --adjust --note "a correction" -- team_abc -2.5`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, in []string) error {
			req := client.TopUpRequest{Amount: in[1], Note: note, Kind: client.LedgerTopUp}
			if adjust {
				req.Kind = client.LedgerAdjust
			}
			b, err := a.client().TopUp(cmd.Context(), in[0], req)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(out(cmd), b.Balance)
			return err
		},
	}
	topUp.Flags().StringVar(&note, "note", "", "why (kept in the ledger)")
	topUp.Flags().BoolVar(&adjust, "adjust", false, "an adjustment (may be negative) rather than a top-up")

	var (
		ledgerTeam string
		limit      int
		ledgerJSON bool
	)
	ledger := &cobra.Command{
		Use:   "ledger [--team ID] [--limit N] [--json]",
		Short: "Show the team's ledger, newest first",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			es, err := a.client().Ledger(cmd.Context(), ledgerTeam, limit)
			if err != nil {
				return err
			}
			if ledgerJSON {
				if es == nil {
					es = []client.LedgerEntry{}
				}
				return printJSON(out(cmd), client.LedgerList{Entries: es})
			}
			t := newTable(out(cmd), "AT", "KIND", "AMOUNT", "SANDBOX", "NOTE", "ACTOR")
			for _, e := range es {
				t.row(timeCell(e.At), e.Kind, e.Amount, orDash(e.SandboxID), orDash(e.Note), orDash(e.Actor))
			}
			return t.flush()
		},
	}
	ledger.Flags().StringVar(&ledgerTeam, "team", "", "another team's ledger (admin key)")
	ledger.Flags().IntVar(&limit, "limit", 0, "at most this many entries (default the server's 100)")
	ledger.Flags().BoolVar(&ledgerJSON, "json", false, "print the entries as JSON")
	cmd.AddCommand(topUp, ledger)
	return cmd
}
