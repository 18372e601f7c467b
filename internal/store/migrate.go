package store

import (
	"context"
	"fmt"
)

// migrations are the schema changes, applied in order, on both databases
// (PostgreSQL gets them through postgresDialect.ddl: write the types as
// SQLite's INTEGER, REAL, BLOB, TEXT, in upper case). The schema version
// (SQLite: PRAGMA user_version; PostgreSQL: the table schema_version) is
// the number already applied. Append new entries; never edit or reorder the
// existing ones.
var migrations = []string{
	// 1: teams, API keys, sandboxes.
	`CREATE TABLE teams (
		id                   TEXT PRIMARY KEY,
		name                 TEXT NOT NULL UNIQUE,
		created_at           INTEGER NOT NULL,
		max_sandboxes        INTEGER NOT NULL,
		max_concurrent_execs INTEGER NOT NULL
	);
	CREATE TABLE api_keys (
		id         TEXT PRIMARY KEY,
		team_id    TEXT NOT NULL REFERENCES teams(id),
		name       TEXT NOT NULL,
		prefix     TEXT NOT NULL,
		hash       TEXT NOT NULL UNIQUE,
		admin      INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		revoked_at INTEGER
	);
	CREATE INDEX api_keys_team ON api_keys(team_id, created_at);
	CREATE TABLE sandboxes (
		id              TEXT PRIMARY KEY,
		team_id         TEXT NOT NULL REFERENCES teams(id),
		template        TEXT NOT NULL,
		template_digest TEXT NOT NULL DEFAULT '',
		runtime         TEXT NOT NULL,
		runtime_version TEXT NOT NULL DEFAULT '',
		state           TEXT NOT NULL,
		cpu             REAL NOT NULL,
		memory_mb       INTEGER NOT NULL,
		disk_mb         INTEGER NOT NULL,
		network         TEXT NOT NULL,
		metadata        TEXT NOT NULL DEFAULT '{}',
		env_keys        TEXT NOT NULL DEFAULT '[]',
		from_pool       INTEGER NOT NULL DEFAULT 0,
		created_at      INTEGER NOT NULL,
		expires_at      INTEGER NOT NULL,
		ended_at        INTEGER,
		end_reason      TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX sandboxes_team ON sandboxes(team_id, created_at);
	CREATE INDEX sandboxes_state ON sandboxes(state, expires_at);`,
	// 2: a team's templates (names pointing at stored template digests)
	// and their builds.
	`CREATE TABLE templates (
		team_id    TEXT NOT NULL REFERENCES teams(id),
		name       TEXT NOT NULL,
		digest     TEXT NOT NULL,
		source     TEXT NOT NULL,
		build_id   TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (team_id, name)
	);
	CREATE INDEX templates_digest ON templates(digest);
	CREATE TABLE template_builds (
		id           TEXT PRIMARY KEY,
		team_id      TEXT NOT NULL REFERENCES teams(id),
		template     TEXT NOT NULL,
		kind         TEXT NOT NULL,
		state        TEXT NOT NULL,
		digest       TEXT NOT NULL DEFAULT '',
		error        TEXT NOT NULL DEFAULT '',
		failed_step  INTEGER NOT NULL DEFAULT 0,
		steps        INTEGER NOT NULL DEFAULT 0,
		cached_steps INTEGER NOT NULL DEFAULT 0,
		built_steps  INTEGER NOT NULL DEFAULT 0,
		created_at   INTEGER NOT NULL,
		started_at   INTEGER,
		finished_at  INTEGER
	);
	CREATE INDEX template_builds_team ON template_builds(team_id, template, created_at);
	CREATE INDEX template_builds_state ON template_builds(state);
	CREATE INDEX sandboxes_template ON sandboxes(template_digest, state);`,
	// 3: eval runs (their inputs, settings and summary) and their trials'
	// results, one row per finished sample.
	`CREATE TABLE eval_runs (
		id          TEXT PRIMARY KEY,
		team_id     TEXT NOT NULL REFERENCES teams(id),
		state       TEXT NOT NULL,
		error       TEXT NOT NULL DEFAULT '',
		settings    TEXT NOT NULL,
		input       BLOB NOT NULL,
		tasks       INTEGER NOT NULL,
		samples     INTEGER NOT NULL,
		summary     TEXT NOT NULL DEFAULT '',
		created_at  INTEGER NOT NULL,
		finished_at INTEGER
	);
	CREATE INDEX eval_runs_team ON eval_runs(team_id, created_at);
	CREATE INDEX eval_runs_state ON eval_runs(state);
	CREATE TABLE eval_trials (
		run_id        TEXT NOT NULL REFERENCES eval_runs(id),
		team_id       TEXT NOT NULL REFERENCES teams(id),
		completion_id INTEGER NOT NULL,
		task_id       TEXT NOT NULL,
		status        TEXT NOT NULL,
		detail        TEXT NOT NULL,
		result        TEXT NOT NULL,
		duration_ms   INTEGER NOT NULL,
		sandbox_id      TEXT NOT NULL DEFAULT '',
		template_digest TEXT NOT NULL DEFAULT '',
		runtime         TEXT NOT NULL DEFAULT '',
		runtime_version TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (run_id, completion_id)
	);`,
	// 4: where a trial's time went: its phases (microseconds, of the
	// completed attempt), its whole duration and its attempts (0: not
	// recorded, e.g. rows written before this migration).
	`ALTER TABLE eval_trials ADD COLUMN create_us INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE eval_trials ADD COLUMN write_us INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE eval_trials ADD COLUMN run_us INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE eval_trials ADD COLUMN delete_us INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE eval_trials ADD COLUMN trial_us INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE eval_trials ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;`,
	// 5: eval runs' execution mode (trial or batch) and batch slice size.
	`ALTER TABLE eval_runs ADD COLUMN mode TEXT NOT NULL DEFAULT 'trial';
	ALTER TABLE eval_runs ADD COLUMN slice INTEGER NOT NULL DEFAULT 0;`,
	// 6: a team's storage limit (MiB; 0 = the server's default).
	`ALTER TABLE teams ADD COLUMN max_storage_mb INTEGER NOT NULL DEFAULT 0;`,
	// 7: the node a sandbox runs on ('' for rows written before this
	// migration, by an embedded server): where calls for it go, what a
	// restarted replica recovers, what a lost node's drain ends.
	`ALTER TABLE sandboxes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
	CREATE INDEX sandboxes_node ON sandboxes(node_id, state);`,
	// 8: several API replicas on one database. A team's sandbox slots held
	// by creates in progress (a reservation per create, of a replica,
	// until expires_at unless renewed), and eval runs' leases (the replica
	// that runs a run, until lease_until unless renewed; '' and 0: none).
	`CREATE TABLE sandbox_slots (
		id         TEXT PRIMARY KEY,
		team_id    TEXT NOT NULL REFERENCES teams(id),
		replica    TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL
	);
	CREATE INDEX sandbox_slots_team ON sandbox_slots(team_id, expires_at);
	CREATE INDEX sandbox_slots_replica ON sandbox_slots(replica);
	CREATE INDEX sandboxes_team_state ON sandboxes(team_id, state);
	ALTER TABLE eval_runs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
	ALTER TABLE eval_runs ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;`,
	// 9: the running sandboxes of a team, which admission counts under
	// the team's lock at every create: a partial index, whose size is
	// the running rows', however long the team's history of ended ones.
	`CREATE INDEX sandboxes_running ON sandboxes(team_id) WHERE state = 'running';`,
	// 10: network rules (issue 11): the lists of a sandbox in mode rules
	// (JSON, '' otherwise), its port settings (JSON) and the hash of its
	// traffic token.
	`ALTER TABLE sandboxes ADD COLUMN network_rules TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN ports TEXT NOT NULL DEFAULT '[]';
	ALTER TABLE sandboxes ADD COLUMN traffic_token_hash TEXT NOT NULL DEFAULT '';`,
	// 11: secrets of the server itself, by name (ServerSecret): made at
	// first use, shared by the replicas of the database.
	`CREATE TABLE server_secrets (
		name  TEXT PRIMARY KEY,
		value BLOB NOT NULL
	);`,
	// 12: template tags: more names of one template ("name:tag"), each
	// pointing at a build's digest (the untagged name is the templates
	// row, E2B's "default").
	`CREATE TABLE template_tags (
		team_id    TEXT NOT NULL REFERENCES teams(id),
		template   TEXT NOT NULL,
		tag        TEXT NOT NULL,
		digest     TEXT NOT NULL,
		build_id   TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (team_id, template, tag)
	);
	CREATE INDEX template_tags_digest ON template_tags(digest);`,
	// 13: snapshots of sandboxes (held by a node), and sandboxes paused or
	// restored from one.
	`CREATE TABLE snapshots (
		id              TEXT PRIMARY KEY,
		team_id         TEXT NOT NULL REFERENCES teams(id),
		sandbox_id      TEXT NOT NULL,
		template        TEXT NOT NULL,
		template_digest TEXT NOT NULL,
		runtime         TEXT NOT NULL,
		runtime_version TEXT NOT NULL DEFAULT '',
		cpu             REAL NOT NULL,
		memory_mb       INTEGER NOT NULL,
		disk_mb         INTEGER NOT NULL,
		network         TEXT NOT NULL,
		network_rules   TEXT NOT NULL DEFAULT '',
		memory          INTEGER NOT NULL,
		size_bytes      INTEGER NOT NULL,
		created_at      INTEGER NOT NULL,
		node_id         TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX snapshots_team ON snapshots(team_id, created_at);
	CREATE INDEX snapshots_digest ON snapshots(template_digest);
	ALTER TABLE sandboxes ADD COLUMN paused_at INTEGER;
	ALTER TABLE sandboxes ADD COLUMN snapshot TEXT NOT NULL DEFAULT '';`,
	// 14: the per-test verdicts, compile phase and language of a whole
	// program's trial (JSON; '' for a Python trial program).
	`ALTER TABLE eval_trials ADD COLUMN tests TEXT NOT NULL DEFAULT '';`,
	// 15: secrets (issue 16). A sandbox's secret names (a JSON list, as
	// env_keys: its values stay with its node, never here); a team's
	// stored secrets, sealed (internal/secrets) and bound to the team and
	// name.
	`ALTER TABLE sandboxes ADD COLUMN secret_names TEXT NOT NULL DEFAULT '[]';
	CREATE TABLE team_secrets (
		team_id    TEXT NOT NULL REFERENCES teams(id),
		name       TEXT NOT NULL,
		sealed     BLOB NOT NULL,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (team_id, name)
	);`,
	// 16: the audit log: who did what (team, key, remote address), to what,
	// with what outcome (HTTP status and error code).
	`CREATE TABLE audit (
		id          TEXT PRIMARY KEY,
		at          INTEGER NOT NULL,
		team_id     TEXT NOT NULL,
		key_id      TEXT NOT NULL,
		key_name    TEXT NOT NULL,
		admin       INTEGER NOT NULL DEFAULT 0,
		remote_addr TEXT NOT NULL,
		action      TEXT NOT NULL,
		target      TEXT NOT NULL DEFAULT '',
		status      INTEGER NOT NULL,
		code        TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX audit_at ON audit(at);
	CREATE INDEX audit_team ON audit(team_id, at);`,
	// 17: a team's request rate limits (per minute; 0: the server's).
	`ALTER TABLE teams ADD COLUMN requests_per_minute INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE teams ADD COLUMN creates_per_minute INTEGER NOT NULL DEFAULT 0;`,
	// 18: tariffs (a named shape and its prices per second, in
	// nano-units of the currency: no float money; and its own CPU-abuse
	// threshold and window, NULL: the server's) with the built-ins
	// seeded; the tariff a sandbox was created with; and metered usage,
	// one segment per running or paused stretch of a sandbox, with the
	// shape and prices it had at its create (a later price change does not
	// rewrite history), advanced by the meter's tick (accrued_until) and
	// closed at the sandbox's pause, resume or end.
	`CREATE TABLE tariffs (
		name                  TEXT PRIMARY KEY,
		cpu                   REAL NOT NULL,
		memory_mb             INTEGER NOT NULL,
		disk_mb               INTEGER NOT NULL,
		price_vcpu_second     INTEGER NOT NULL,
		price_gib_second      INTEGER NOT NULL,
		price_disk_gib_second INTEGER NOT NULL,
		cpu_abuse_threshold   REAL,
		cpu_abuse_window_us   INTEGER,
		created_at            INTEGER NOT NULL,
		updated_at            INTEGER NOT NULL
	);
	INSERT INTO tariffs VALUES ('small', 1, 512, 2048, 14000, 4500, 40, NULL, NULL, 0, 0);
	INSERT INTO tariffs VALUES ('standard', 2, 2048, 4096, 14000, 4500, 40, NULL, NULL, 0, 0);
	INSERT INTO tariffs VALUES ('large', 4, 8192, 10240, 14000, 4500, 40, NULL, NULL, 0, 0);
	ALTER TABLE sandboxes ADD COLUMN tariff TEXT NOT NULL DEFAULT '';
	CREATE TABLE usage_segments (
		sandbox_id            TEXT NOT NULL,
		seq                   INTEGER NOT NULL,
		team_id               TEXT NOT NULL,
		template              TEXT NOT NULL,
		tariff                TEXT NOT NULL,
		eval_run              TEXT NOT NULL,
		cpu                   REAL NOT NULL,
		memory_mb             INTEGER NOT NULL,
		disk_mb               INTEGER NOT NULL,
		price_vcpu_second     INTEGER NOT NULL,
		price_gib_second      INTEGER NOT NULL,
		price_disk_gib_second INTEGER NOT NULL,
		paused                INTEGER NOT NULL,
		started_at            INTEGER NOT NULL,
		accrued_until         INTEGER NOT NULL,
		ended_at              INTEGER,
		PRIMARY KEY (sandbox_id, seq)
	);
	CREATE INDEX usage_segments_team ON usage_segments(team_id, started_at);
	CREATE INDEX usage_segments_open ON usage_segments(ended_at);`,
	// 19: the CPU-abuse rule (docs/abuse.md): a sandbox marked long-running
	// (throttled, never stopped), and when the rule warned it and when it
	// throttled it.
	`ALTER TABLE sandboxes ADD COLUMN long_running INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN cpu_abuse_warned_at INTEGER;
	ALTER TABLE sandboxes ADD COLUMN cpu_throttled_at INTEGER;`,
	// 20: prepaid balances (docs/usage.md): a team's ledger of top-ups and
	// adjustments (an admin's, with a note) and of charges, one per ended
	// sandbox (its final metered cost, negative; the sandbox id unique, so
	// that racing replicas charge it once); usage segments whose sandbox
	// has been charged are marked.
	`CREATE TABLE ledger (
		id         TEXT PRIMARY KEY,
		team_id    TEXT NOT NULL REFERENCES teams(id),
		kind       TEXT NOT NULL,
		amount     INTEGER NOT NULL,
		sandbox_id TEXT UNIQUE,
		note       TEXT NOT NULL DEFAULT '',
		actor      TEXT NOT NULL DEFAULT '',
		at         INTEGER NOT NULL
	);
	CREATE INDEX ledger_team ON ledger(team_id, at);
	ALTER TABLE usage_segments ADD COLUMN charged INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX usage_segments_uncharged ON usage_segments(charged, ended_at);`,
}

// migrate applies the pending migrations, all in one transaction, and
// records the new schema version. Stores that open one database at once
// (replicas starting together) migrate it one after the other: the first
// applies the migrations, the others find them applied.
func (s *Store) migrate(ctx context.Context) error {
	return s.inTx(ctx, func(tx *txn) error {
		if err := s.d.beginMigration(ctx, tx); err != nil {
			return err
		}
		v, err := s.d.schemaVersion(ctx, tx)
		if err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if v > len(migrations) {
			return fmt.Errorf("schema version %d is newer than this binary's %d", v, len(migrations))
		}
		if v == len(migrations) {
			return nil
		}
		for i := v; i < len(migrations); i++ {
			if _, err := tx.exec(ctx, s.d.ddl(migrations[i])); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
		}
		if err := s.d.setSchemaVersion(ctx, tx, len(migrations)); err != nil {
			return fmt.Errorf("set schema version: %w", err)
		}
		return nil
	})
}

// SchemaVersion returns the number of migrations applied to the database.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	v, err := s.d.schemaVersion(ctx, s)
	if err != nil {
		return 0, fmt.Errorf("store: schema version: %w", err)
	}
	return v, nil
}
