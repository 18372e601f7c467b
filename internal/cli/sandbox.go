package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

func newSandboxCmd(a *app) *cobra.Command {
	cmd := groupCommand(&cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, inspect and use sandboxes",
	})
	cmd.AddCommand(
		newSandboxCreateCmd(a),
		newSandboxListCmd(a),
		newSandboxGetCmd(a),
		newSandboxRmCmd(a),
		newSandboxTimeoutCmd(a),
		newSandboxExecCmd(a),
		newSandboxCpCmd(a),
		newSandboxPsCmd(a),
		newSandboxKillCmd(a),
		newSandboxPortCmd(a),
		newSandboxNetworkCmd(a),
		newSandboxSnapshotCmd(a),
		newSandboxForkCmd(a),
		newSandboxPauseCmd(a),
		newSandboxResumeCmd(a),
	)
	return cmd
}

func newSandboxCreateCmd(a *app) *cobra.Command {
	var (
		req           client.CreateSandboxRequest
		timeout, wait seconds
		env, md       []string
		secretNames   []string
		netMode       string
		allow, deny   []string
		public        []int
		asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Long: `Create a sandbox and print its id once it runs (the whole object with --json).

With --wait, when the team is at its sandbox limit the request queues up to
that long for a slot instead of failing with too_many_sandboxes, and when the
host has no room (its pids or memory, shared by all teams), for capacity
instead of failing with insufficient_capacity.`,
		Example: `  id=$(evalbox sandbox create --template python --timeout 10m --metadata run=r1)`,
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.Env, err = parseKV(cmd, "env", env); err != nil {
				return err
			}
			if req.Metadata, err = parseKV(cmd, "metadata", md); err != nil {
				return err
			}
			if req.Secrets, err = secretsFromEnv(cmd, secretNames); err != nil {
				return err
			}
			req.Timeout = wholeSeconds(time.Duration(timeout))
			req.WaitSeconds = wholeSeconds(time.Duration(wait))
			req.Network = networkSpec(netMode, allow, deny)
			if req.Snapshot != "" && !cmd.Flags().Changed("template") {
				req.Template = "" // the snapshot's
			}
			for _, p := range public {
				req.Ports = append(req.Ports, client.PortSpec{Port: p, Public: true})
			}
			sb, err := a.client().CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), sb)
			}
			_, err = fmt.Fprintln(out(cmd), sb.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&req.Template, "template", "t", "base", "template to create the sandbox from")
	f.StringVar(&req.Tariff, "tariff", "", "tariff: its shape and prices (evalbox tariffs ls; default: the template's shape at the server's default tariff)")
	f.StringVar(&req.Runtime, "runtime", "", "runtime: gvisor or namespaces (default: the server's)")
	f.Var(&timeout, "timeout", "TTL in seconds or as a duration (default: the server's)")
	f.Float64Var(&req.CPU, "cpu", 0, "vCPUs (default: the template's)")
	f.IntVar(&req.MemoryMB, "memory-mb", 0, "memory limit in MiB (default: the template's)")
	f.IntVar(&req.DiskMB, "disk-mb", 0, "writable disk in MiB (default: the template's)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringArrayVar(&secretNames, "secret", nil, "a secret: NAME, its value taken from this shell's $NAME (repeatable; never shown nor logged)")
	f.StringArrayVar(&req.SecretRefs, "secret-ref", nil, "a stored secret of the team (evalbox secrets set) by NAME (repeatable)")
	f.StringArrayVarP(&md, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	f.StringVar(&netMode, "network", "", "network: none, outbound or rules (default none; rules when --allow or --deny is given)")
	f.StringArrayVar(&allow, "allow", nil, "network rules: a CIDR, domain or *.domain the sandbox may reach (repeatable)")
	f.StringArrayVar(&deny, "deny", nil, "network rules: a CIDR, domain or *.domain refused even when allowed (repeatable)")
	f.IntSliceVar(&public, "public-port", nil, "open this port's URLs to anyone, with no key or token (repeatable)")
	f.Var(&wait, "wait", "queue up to this long when the team is at its sandbox limit or the host has no room")
	f.StringVar(&req.Snapshot, "snapshot", "", "restore the sandbox from this snapshot (its template, runtime, shape and network)")
	f.BoolVar(&req.LongRunning, "long-running", false, "exempt it from the CPU-abuse stop: held above the server's CPU threshold for its window, it is throttled to half its CPU instead (docs/abuse.md)")
	f.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxListCmd(a *app) *cobra.Command {
	var (
		md     []string
		all    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List sandboxes (running ones unless --all)",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := parseKV(cmd, "metadata", md)
			if err != nil {
				return err
			}
			sbs, err := a.client().ListSandboxes(cmd.Context(), client.ListOptions{Metadata: filter, All: all})
			if err != nil {
				return err
			}
			if asJSON {
				if sbs == nil {
					sbs = []client.Sandbox{}
				}
				return printJSON(out(cmd), client.SandboxList{Sandboxes: sbs})
			}
			t := newTable(out(cmd), "ID", "TEMPLATE", "RUNTIME", "STATE", "CREATED", "EXPIRES", "METADATA")
			for _, sb := range sbs {
				t.row(sb.ID, sb.Template, sb.Runtime, sb.State, timeCell(sb.CreatedAt), timeCell(sb.ExpiresAt), kvCell(sb.Metadata))
			}
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&md, "metadata", "m", nil, "only sandboxes with metadata KEY=VALUE (repeatable, all must match)")
	f.BoolVarP(&all, "all", "a", false, "also list sandboxes that ended")
	f.BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newSandboxGetCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sb, err := a.client().GetSandbox(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), sb)
			}
			tmpl := sb.Template
			if sb.TemplateDigest != "" {
				tmpl += " (" + sb.TemplateDigest + ")"
			}
			rt := sb.Runtime
			if sb.RuntimeVersion != "" {
				rt += " " + sb.RuntimeVersion
			}
			t := newTable(out(cmd), "ID", sb.ID)
			t.row("Team", sb.TeamID)
			t.row("Template", tmpl)
			t.row("Runtime", rt)
			t.row("State", sb.State)
			t.row("CPU", strconv.FormatFloat(sb.CPU, 'g', -1, 64))
			t.row("Memory", strconv.Itoa(sb.MemoryMB)+" MiB")
			t.row("Disk", strconv.Itoa(sb.DiskMB)+" MiB")
			t.row("Network", sb.Network)
			t.row("Metadata", kvCell(sb.Metadata))
			t.row("Env", orDash(strings.Join(sb.EnvKeys, ",")))
			t.row("Secrets", orDash(strings.Join(sb.SecretNames, ",")))
			t.row("Tariff", orDash(sb.Tariff))
			t.row("Created", timeCell(sb.CreatedAt))
			t.row("Expires", timeCell(sb.ExpiresAt))
			if sb.EndedAt != nil {
				t.row("Ended", timeCell(*sb.EndedAt)+" "+sb.EndReason)
			}
			t.row("From pool", strconv.FormatBool(sb.FromPool))
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxRmCmd(a *app) *cobra.Command {
	var (
		md     []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "rm (ID... | --metadata KEY=VALUE...)",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes by id, or all running ones whose metadata matches",
		Long: `Delete sandboxes by id, or all running ones whose metadata matches.
Prints the ids deleted, one a line (a DeleteResult with --json). With several
ids, every id is tried; the exit status is 1 if any failed.`,
		Args: args(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, ids []string) error {
			filter, err := parseKV(cmd, "metadata", md)
			if err != nil {
				return err
			}
			if (len(ids) == 0) == (len(filter) == 0) {
				return usagef(cmd, "give sandbox ids or --metadata, not both nor neither")
			}
			c := a.client()
			var res client.DeleteResult
			var failed int
			if len(filter) > 0 {
				if res.Deleted, err = c.DeleteSandboxes(cmd.Context(), filter); err != nil {
					return err
				}
			} else {
				for _, id := range ids {
					if err := c.DeleteSandbox(cmd.Context(), id); err != nil {
						if len(ids) == 1 {
							return err
						}
						_, msg := exitStatus(err)
						fmt.Fprintf(cmd.ErrOrStderr(), "evalbox: %s\n", oneLine(msg))
						failed++
						continue
					}
					res.Deleted = append(res.Deleted, id)
				}
			}
			if res.Deleted == nil {
				res.Deleted = []string{}
			}
			if asJSON {
				err = printJSON(out(cmd), res)
			} else {
				for _, id := range res.Deleted {
					fmt.Fprintln(out(cmd), id)
				}
			}
			if err == nil && failed > 0 {
				err = &exitError{code: ExitError}
			}
			return err
		},
	}
	cmd.Flags().StringArrayVarP(&md, "metadata", "m", nil, "delete the running sandboxes with metadata KEY=VALUE (repeatable, all must match)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func newSandboxTimeoutCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "timeout ID SECONDS",
		Short: "Set a running sandbox to expire SECONDS from now",
		Long:  "Set a running sandbox to expire SECONDS (or a duration: 10m) from now, bounded by the server's maximum.",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			d, err := parseSeconds(argv[1])
			if err != nil || d <= 0 {
				return usagef(cmd, "SECONDS %q: want a positive number of seconds or a duration", argv[1])
			}
			sb, err := a.client().SetTimeout(cmd.Context(), argv[0], d)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), sb)
			}
			_, err = fmt.Fprintf(out(cmd), "%s expires at %s\n", sb.ID, timeCell(sb.ExpiresAt))
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxPsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps ID",
		Short: "List a sandbox's background processes",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ps, err := a.client().ListProcesses(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if asJSON {
				if ps == nil {
					ps = []client.Process{}
				}
				return printJSON(out(cmd), client.ProcessList{Processes: ps})
			}
			t := newTable(out(cmd), "ID", "PID", "STATUS", "EXIT", "STARTED", "TAG", "COMMAND")
			for _, p := range ps {
				status, exit := client.StatusRunning, "-"
				if !p.Running && p.Result != nil {
					status, exit = p.Result.Status, strconv.Itoa(p.Result.ExitCode)
				}
				t.row(p.ID, strconv.Itoa(p.Pid), status, exit, timeCell(p.StartedAt), orDash(p.Tag), strings.Join(p.Argv, " "))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newSandboxKillCmd(a *app) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill ID PROCESS_ID",
		Short: "Kill a background process and its tree (or send --signal)",
		Long: `Without --signal, SIGKILL the background process and its whole process tree.
With --signal, send that signal (a name like TERM or SIGTERM, or a number) to the process only.`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c := a.client()
			if sig != "" {
				return c.SignalProcess(cmd.Context(), argv[0], argv[1], sig)
			}
			return c.KillProcess(cmd.Context(), argv[0], argv[1])
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "", "signal to send instead of killing the tree (TERM, SIGINT, 15, …)")
	return cmd
}

// networkSpec is the network of --network, --allow and --deny: lists mean
// mode rules unless a mode is given.
func networkSpec(mode string, allow, deny []string) client.NetworkSpec {
	if mode == "" && (len(allow) > 0 || len(deny) > 0) {
		mode = client.NetworkRules
	}
	return client.NetworkSpec{Mode: mode, Allow: allow, Deny: deny}
}

func newSandboxPortCmd(a *app) *cobra.Command {
	var pathForm bool
	cmd := &cobra.Command{
		Use:   "port ID PORT",
		Short: "Print the URL of a port of a sandbox",
		Long: `Print the URL that reaches PORT in the sandbox: the host form
({port}-{id}.{domain}) when the server has a sandbox domain, else the path
form (/v1/sandboxes/{id}/ports/{port}/). A request to it needs the team's API
key (Authorization), the sandbox's traffic token (X-Evalbox-Traffic-Token, or
?evalbox_token= in a browser), or a public port (create --public-port).`,
		Example: `  curl -H "Authorization: Bearer $EVALBOX_API_KEY" "$(evalbox sandbox port $id 8000)"`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			port, err := strconv.Atoi(argv[1])
			if err != nil || port < 1 || port > 65535 {
				return usagef(cmd, "PORT %q: want a number from 1 to 65535", argv[1])
			}
			c := a.client()
			sb, err := c.GetSandbox(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			u := c.HostPortURL(sb.ID, port, sb.Domain)
			if u == "" || pathForm {
				u = c.PortURL(sb.ID, port)
			}
			_, err = fmt.Fprintln(out(cmd), u)
			return err
		},
	}
	cmd.Flags().BoolVar(&pathForm, "path", false, "print the path form even when the server has a sandbox domain")
	return cmd
}

func newSandboxNetworkCmd(a *app) *cobra.Command {
	var (
		mode        string
		allow, deny []string
		asJSON      bool
	)
	cmd := &cobra.Command{
		Use:   "network ID [flags]",
		Short: "Show or change a running sandbox's network",
		Long: `Show a sandbox's network, or change it while it runs: --allow and --deny
replace the rule lists (mode rules), --mode outbound lifts them. New
connections follow the new rules at once; open ones they deny are cut. A
sandbox created with network none cannot be opened.`,
		Example: `  evalbox sandbox network $id --allow pypi.org --allow '*.pythonhosted.org'
  evalbox sandbox network $id --mode rules          # close it: allow nothing`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c := a.client()
			var sb *client.Sandbox
			var err error
			if mode == "" && len(allow) == 0 && len(deny) == 0 {
				sb, err = c.GetSandbox(cmd.Context(), argv[0])
			} else {
				sb, err = c.SetNetwork(cmd.Context(), argv[0], networkSpec(mode, allow, deny))
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out(cmd), client.NetworkSpec{Mode: sb.Network, Allow: rulesOf(sb).Allow, Deny: rulesOf(sb).Deny})
			}
			w := out(cmd)
			fmt.Fprintf(w, "mode:  %s\n", sb.Network)
			if r := sb.NetworkRules; r != nil {
				fmt.Fprintf(w, "allow: %s\n", strings.Join(r.Allow, " "))
				_, err = fmt.Fprintf(w, "deny:  %s\n", strings.Join(r.Deny, " "))
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", "", "outbound or rules (rules when --allow or --deny is given)")
	f.StringArrayVar(&allow, "allow", nil, "a CIDR, domain or *.domain the sandbox may reach (repeatable; replaces the list)")
	f.StringArrayVar(&deny, "deny", nil, "a CIDR, domain or *.domain refused even when allowed (repeatable; replaces the list)")
	f.BoolVar(&asJSON, "json", false, "print the network as JSON")
	return cmd
}

func rulesOf(sb *client.Sandbox) client.NetworkRuleLists {
	if sb.NetworkRules == nil {
		return client.NetworkRuleLists{}
	}
	return *sb.NetworkRules
}
