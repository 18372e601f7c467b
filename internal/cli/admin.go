package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

func newKeysCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "keys",
		Short: "Manage API keys",
	})

	var (
		req          client.CreateKeyRequest
		createJSON   bool
		listJSON     bool
		createTeamID string
	)
	create := &cobra.Command{
		Use:   "create --name NAME [--team TEAM_ID]",
		Short: "Create an API key and print its secret (shown only once)",
		Long: `Create an API key and print its secret, which is shown only this once.
The key belongs to the caller's team; --team (another team) needs an admin key.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Name == "" {
				return usagef(cmd, "--name is required")
			}
			req.TeamID = createTeamID
			k, err := a.client().CreateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if createJSON {
				return printJSON(out(cmd), k)
			}
			_, err = fmt.Fprintln(out(cmd), k.Key)
			return err
		},
	}
	create.Flags().StringVar(&req.Name, "name", "", "name of the key (required)")
	create.Flags().StringVar(&createTeamID, "team", "", "team of the key (default: the caller's)")
	create.Flags().BoolVar(&createJSON, "json", false, "print the key record (with its secret) as JSON")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List API keys (an admin key sees all teams')",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, err := a.client().ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			if listJSON {
				if keys == nil {
					keys = []client.APIKey{}
				}
				return printJSON(out(cmd), client.KeyList{Keys: keys})
			}
			t := newTable(out(cmd), "ID", "NAME", "TEAM", "PREFIX", "ADMIN", "CREATED", "REVOKED")
			for _, k := range keys {
				revoked := "-"
				if k.RevokedAt != nil {
					revoked = timeCell(*k.RevokedAt)
				}
				t.row(k.ID, k.Name, k.TeamID, k.Prefix, strconv.FormatBool(k.Admin), timeCell(k.CreatedAt), revoked)
			}
			return t.flush()
		},
	}
	ls.Flags().BoolVar(&listJSON, "json", false, "print the list as JSON")

	revoke := &cobra.Command{
		Use:   "revoke KEY_ID...",
		Short: "Revoke API keys by id",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c := a.client()
			for _, id := range ids {
				if err := c.RevokeKey(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}

func newTeamsCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:   "teams",
		Short: "Manage teams and their limits (admin key only)",
	})

	var (
		maxSandboxes, maxExecs, maxStorage int
		reqsPerMin, createsPerMin          int
		asJSON                             bool
	)
	printTeam := func(cmd *cobra.Command, t *client.Team) error {
		if asJSON {
			return printJSON(out(cmd), t)
		}
		_, err := fmt.Fprintln(out(cmd), t.ID)
		return err
	}
	create := &cobra.Command{
		Use:   "create NAME [--max-sandboxes N] [--max-execs N] [--max-storage-mb N] [--requests-per-minute N] [--creates-per-minute N]",
		Short: "Create a team and print its id",
		Long:  "Create a team and print its id. Limits left out take the server's defaults.",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			req := client.CreateTeamRequest{Name: argv[0]}
			if maxSandboxes > 0 || maxExecs > 0 || maxStorage > 0 || reqsPerMin > 0 || createsPerMin > 0 {
				req.Limits = &client.Limits{MaxSandboxes: maxSandboxes, MaxConcurrentExec: maxExecs, MaxStorageMB: maxStorage,
					RequestsPerMinute: reqsPerMin, CreatesPerMinute: createsPerMin}
			}
			t, err := a.client().CreateTeam(cmd.Context(), req)
			if err != nil {
				return err
			}
			return printTeam(cmd, t)
		},
	}
	update := &cobra.Command{
		Use:   "update TEAM_ID [--max-sandboxes N] [--max-execs N] [--max-storage-mb N] [--requests-per-minute N] [--creates-per-minute N]",
		Short: "Change a team's limits",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			fl := cmd.Flags()
			changed := false
			for _, name := range []string{"max-sandboxes", "max-execs", "max-storage-mb", "requests-per-minute", "creates-per-minute"} {
				changed = changed || fl.Changed(name)
			}
			if !changed {
				return usagef(cmd, "give --max-sandboxes, --max-execs, --max-storage-mb, --requests-per-minute and/or --creates-per-minute")
			}
			c := a.client()
			t, err := c.GetTeam(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			lim := t.Limits
			if fl.Changed("max-sandboxes") {
				lim.MaxSandboxes = maxSandboxes
			}
			if fl.Changed("max-execs") {
				lim.MaxConcurrentExec = maxExecs
			}
			if fl.Changed("max-storage-mb") {
				lim.MaxStorageMB = maxStorage
			}
			if fl.Changed("requests-per-minute") {
				lim.RequestsPerMinute = reqsPerMin
			}
			if fl.Changed("creates-per-minute") {
				lim.CreatesPerMinute = createsPerMin
			}
			if t, err = c.UpdateTeam(cmd.Context(), argv[0], client.UpdateTeamRequest{Limits: lim}); err != nil {
				return err
			}
			return printTeam(cmd, t)
		},
	}
	for _, c := range []*cobra.Command{create, update} {
		c.Flags().IntVar(&maxSandboxes, "max-sandboxes", 0, "limit of running sandboxes")
		c.Flags().IntVar(&maxExecs, "max-execs", 0, "limit of concurrent commands")
		c.Flags().IntVar(&maxStorage, "max-storage-mb", 0, "storage limit in MiB: templates, uploads being processed, eval inputs (0 = the server's default)")
		c.Flags().IntVar(&reqsPerMin, "requests-per-minute", 0, "request rate limit, per API replica (0 = the server's default)")
		c.Flags().IntVar(&createsPerMin, "creates-per-minute", 0, "create rate limit (sandboxes, forks, resumes, eval runs), per API replica (0 = the server's default)")
		c.Flags().BoolVar(&asJSON, "json", false, "print the team as JSON")
	}

	get := &cobra.Command{
		Use:   "get TEAM_ID",
		Short: "Show a team",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			t, err := a.client().GetTeam(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), t)
			}
			return teamTable(cmd, []client.Team{*t})
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print the team as JSON")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List teams",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			teams, err := a.client().ListTeams(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if teams == nil {
					teams = []client.Team{}
				}
				return printJSON(out(cmd), client.TeamList{Teams: teams})
			}
			return teamTable(cmd, teams)
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	cmd.AddCommand(create, ls, get, update)
	return cmd
}

func teamTable(cmd *cobra.Command, teams []client.Team) error {
	cols := []string{"ID", "NAME", "MAX_SANDBOXES", "MAX_EXECS", "MAX_STORAGE_MB", "REQUESTS/MIN", "CREATES/MIN", "CREATED"}
	withUsage := len(teams) == 1 && teams[0].Usage != nil
	if withUsage {
		cols = append(cols, "STORAGE")
	}
	t := newTable(out(cmd), cols...)
	for _, tm := range teams {
		orDefault := func(n int) string {
			if n > 0 {
				return strconv.Itoa(n)
			}
			return "default"
		}
		row := []string{tm.ID, tm.Name, strconv.Itoa(tm.Limits.MaxSandboxes), strconv.Itoa(tm.Limits.MaxConcurrentExec), orDefault(tm.Limits.MaxStorageMB),
			orDefault(tm.Limits.RequestsPerMinute), orDefault(tm.Limits.CreatesPerMinute), timeCell(tm.CreatedAt)}
		if withUsage {
			u := tm.Usage
			used := humanBytes(u.StorageBytes)
			if u.MaxStorageBytes > 0 {
				used += " of " + humanBytes(u.MaxStorageBytes)
			}
			row = append(row, used)
		}
		t.row(row...)
	}
	return t.flush()
}

// shortDigest keeps "algo:" and 12 hex digits.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok {
		algo, hex = "", d
	} else {
		algo += ":"
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return orDash(algo + hex)
}

func newHealthCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check that the server is up (and, with an admin key, its host capacity)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			h, err := c.Health(cmd.Context())
			if err != nil {
				return err
			}
			// Capacity needs an admin key; without one health is all.
			cp, _ := c.Capacity(cmd.Context())
			if asJSON {
				return printJSON(out(cmd), struct {
					*client.Health
					Capacity *client.Capacity `json:"capacity,omitempty"`
				}{h, cp})
			}
			if _, err = fmt.Fprintf(out(cmd), "%s (version %s, runtimes: %s)\n", h.Status, h.Version, strings.Join(h.Runtimes, ", ")); err != nil || cp == nil {
				return err
			}
			avail := "unknown"
			if cp.MemoryAvailableMB >= 0 {
				avail = fmt.Sprintf("%d MiB", cp.MemoryAvailableMB)
			}
			_, err = fmt.Fprintf(out(cmd), "host capacity: pids %d of %d reserved (%d free); memory limits %d of %d MiB reserved (%d MiB free); "+
				"memory available %s (reserve %d MiB); %d sandboxes, %d waiting\n",
				cp.Pids.Reserved, cp.Pids.Budget, cp.Pids.Free, cp.MemoryMB.Reserved, cp.MemoryMB.Budget, cp.MemoryMB.Free,
				avail, cp.MemoryReserveMB, cp.Sandboxes, cp.Waiting)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the health as JSON")
	return cmd
}
