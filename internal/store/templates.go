package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/evalbox/evalbox/pkg/client"
)

// TemplateRow is a team's name for a stored template: the template itself
// (root filesystem, defaults) lives in the template store under Digest.
type TemplateRow struct {
	TeamID    string
	Name      string
	Digest    string
	Source    string // build or import
	BuildID   string
	CreatedAt time.Time
}

const templateCols = `team_id, name, digest, source, build_id, created_at`

// PutTemplate points the team's template name at a digest, replacing what
// it pointed at before, and returns the digest it replaced ("" if none).
//
// Of concurrent puts of one name, each returns the digest of the one before
// it, so that every replaced digest is returned exactly once (its caller
// collects its files): the row is read FOR UPDATE, and a name that does not
// exist yet is inserted with ON CONFLICT DO NOTHING, which a put that lost
// the race to insert it retries as an update.
func (s *Store) PutTemplate(ctx context.Context, t TemplateRow) (string, error) {
	if t.TeamID == "" || t.Name == "" || t.Digest == "" {
		return "", errors.New("store: put template: team, name and digest are required")
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now()
	}
	old, err := s.repoint(ctx,
		`SELECT digest FROM templates WHERE team_id = ? AND name = ?`, []any{t.TeamID, t.Name},
		`UPDATE templates SET digest = ?, source = ?, build_id = ?, created_at = ? WHERE team_id = ? AND name = ?`,
		[]any{t.Digest, t.Source, t.BuildID, toDB(norm(t.CreatedAt)), t.TeamID, t.Name},
		`INSERT INTO templates (`+templateCols+`) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (team_id, name) DO NOTHING`,
		[]any{t.TeamID, t.Name, t.Digest, t.Source, t.BuildID, toDB(norm(t.CreatedAt))})
	if err != nil {
		return "", fmt.Errorf("store: put template %s: %w", t.Name, s.mapConstraint(err, "team"))
	}
	return old, nil
}

// repoint points one row (a name or a tag) at a digest and returns the
// digest it pointed at before ("" if the row is new): sel reads the row's
// digest, locked; update changes it; insert adds it (ON CONFLICT DO
// NOTHING), and a row another transaction inserted meanwhile is read
// again and updated.
func (s *Store) repoint(ctx context.Context, sel string, selArgs []any, update string, updArgs []any, insert string, insArgs []any) (string, error) {
	var old string
	err := s.inTx(ctx, func(tx *txn) error {
		for {
			old = ""
			err := tx.queryRow(ctx, sel+s.d.lockClause(), selArgs...).Scan(&old)
			if err == nil {
				_, err = tx.exec(ctx, update, updArgs...)
				return err
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			res, err := tx.exec(ctx, insert, insArgs...)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 1 {
				return err
			}
			// Inserted meanwhile by another transaction, now committed
			// (PostgreSQL; never on SQLite): read it again, locked.
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	})
	return old, err
}

// GetTemplate returns the team's template row by name; another team's is
// ErrNotFound.
func (s *Store) GetTemplate(ctx context.Context, teamID, name string) (TemplateRow, error) {
	t, err := scanTemplate(s.queryRow(ctx, `SELECT `+templateCols+` FROM templates WHERE team_id = ? AND name = ?`, teamID, name))
	if err != nil {
		return TemplateRow{}, fmt.Errorf("store: get template %s: %w", name, err)
	}
	return t, nil
}

// ListTemplates returns the team's template rows by name.
func (s *Store) ListTemplates(ctx context.Context, teamID string) ([]TemplateRow, error) {
	rows, err := s.query(ctx, `SELECT `+templateCols+` FROM templates WHERE team_id = ? ORDER BY name`, teamID)
	if err != nil {
		return nil, fmt.Errorf("store: list templates: %w", err)
	}
	defer rows.Close()
	var out []TemplateRow
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list templates: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTemplate removes the team's template name and returns the digest
// it pointed at; an unknown name (or another team's) is ErrNotFound. The
// digest comes from the deleted row itself (RETURNING), so that a
// concurrent PutTemplate's digest is never the one reported.
func (s *Store) DeleteTemplate(ctx context.Context, teamID, name string) (string, error) {
	var digest string
	err := s.writeRow(ctx, `DELETE FROM templates WHERE team_id = ? AND name = ? RETURNING digest`, teamID, name).Scan(&digest)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: delete template %s: %w", name, err)
	}
	return digest, nil
}

// TemplateDigests returns every digest that a template name or tag of any
// team points at.
func (s *Store) TemplateDigests(ctx context.Context) (map[string]bool, error) {
	rows, err := s.query(ctx, `SELECT digest FROM templates UNION SELECT digest FROM template_tags
		UNION SELECT template_digest FROM snapshots`)
	if err != nil {
		return nil, fmt.Errorf("store: template digests: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, fmt.Errorf("store: template digests: %w", err)
		}
		out[d] = true
	}
	return out, rows.Err()
}

// DigestInUse reports whether a template name or tag points at digest, a
// running sandbox runs from it or a snapshot was taken of one that did (a
// sandbox restored from it needs its files).
func (s *Store) DigestInUse(ctx context.Context, digest string) (bool, error) {
	var n int
	err := s.queryRow(ctx, `SELECT
		(SELECT COUNT(*) FROM templates WHERE digest = ?) +
		(SELECT COUNT(*) FROM template_tags WHERE digest = ?) +
		(SELECT COUNT(*) FROM sandboxes WHERE template_digest = ? AND state = ?) +
		(SELECT COUNT(*) FROM snapshots WHERE template_digest = ?)`,
		digest, digest, digest, client.StateRunning, digest).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("store: digest in use: %w", err)
	}
	return n > 0, nil
}

// CountRunningByTemplate counts the team's running sandboxes of a template
// name, under any of its tags ("name:tag").
func (s *Store) CountRunningByTemplate(ctx context.Context, teamID, name string) (int, error) {
	var n int
	err := s.queryRow(ctx, `SELECT COUNT(*) FROM sandboxes WHERE team_id = ? AND state = ?
		AND (template = ? OR substr(template, 1, ?) = ?)`,
		teamID, client.StateRunning, name, len(name)+1, name+":").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count sandboxes of %s: %w", name, err)
	}
	return n, nil
}

func scanTemplate(sc scanner) (TemplateRow, error) {
	var t TemplateRow
	var created int64
	err := sc.Scan(&t.TeamID, &t.Name, &t.Digest, &t.Source, &t.BuildID, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return TemplateRow{}, ErrNotFound
	}
	if err != nil {
		return TemplateRow{}, err
	}
	t.CreatedAt = fromDB(created)
	return t, nil
}

// Builds are client.TemplateBuild values plus the team.

const buildCols = `id, team_id, template, kind, state, digest, error, failed_step, steps, cached_steps, built_steps,
	created_at, started_at, finished_at`

// InsertBuild stores a new build of the team. An empty ID gets a new
// "bld_…" id, an empty State "queued", a zero CreatedAt the current time.
func (s *Store) InsertBuild(ctx context.Context, teamID string, b client.TemplateBuild) (client.TemplateBuild, error) {
	if teamID == "" || b.Template == "" || b.Kind == "" {
		return client.TemplateBuild{}, errors.New("store: insert build: team, template and kind are required")
	}
	if b.ID == "" {
		b.ID = NewID("bld")
	}
	if b.State == "" {
		b.State = client.BuildStateQueued
	}
	if b.CreatedAt.IsZero() {
		b.CreatedAt = now()
	}
	b.CreatedAt = norm(b.CreatedAt)
	_, err := s.exec(ctx, `INSERT INTO template_builds (`+buildCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.ID, teamID, b.Template, b.Kind, b.State, b.Digest, b.Error, b.FailedStep, b.Steps, b.CachedSteps, b.BuiltSteps,
		toDB(b.CreatedAt), nullTime(b.StartedAt), nullTime(b.FinishedAt))
	if err != nil {
		return client.TemplateBuild{}, fmt.Errorf("store: insert build: %w", s.mapConstraint(err, "team"))
	}
	return b, nil
}

// UpdateBuild writes a build's state, result and times.
func (s *Store) UpdateBuild(ctx context.Context, b client.TemplateBuild) error {
	res, err := s.exec(ctx, `UPDATE template_builds SET state = ?, digest = ?, error = ?, failed_step = ?,
		steps = ?, cached_steps = ?, built_steps = ?, started_at = ?, finished_at = ? WHERE id = ?`,
		b.State, b.Digest, b.Error, b.FailedStep, b.Steps, b.CachedSteps, b.BuiltSteps,
		nullTime(normPtr(b.StartedAt)), nullTime(normPtr(b.FinishedAt)), b.ID)
	if err != nil {
		return fmt.Errorf("store: update build %s: %w", b.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: update build %s: %w", b.ID, ErrNotFound)
	}
	return nil
}

// GetBuild returns the team's build; another team's is ErrNotFound.
func (s *Store) GetBuild(ctx context.Context, teamID, id string) (client.TemplateBuild, error) {
	b, _, err := scanBuild(s.queryRow(ctx, `SELECT `+buildCols+` FROM template_builds WHERE id = ? AND team_id = ?`, id, teamID))
	if err != nil {
		return client.TemplateBuild{}, fmt.Errorf("store: get build %s: %w", id, err)
	}
	return b, nil
}

// BuildRef is a build and its team.
type BuildRef struct {
	TeamID string
	Build  client.TemplateBuild
}

// ListBuildsByState returns the builds (of every team) in one of states.
func (s *Store) ListBuildsByState(ctx context.Context, states ...string) ([]BuildRef, error) {
	if len(states) == 0 {
		return nil, nil
	}
	q := `SELECT ` + buildCols + ` FROM template_builds WHERE state IN (?` + strings.Repeat(`, ?`, len(states)-1) + `) ORDER BY created_at`
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = st
	}
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list builds: %w", err)
	}
	defer rows.Close()
	var out []BuildRef
	for rows.Next() {
		b, team, err := scanBuild(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list builds: %w", err)
		}
		out = append(out, BuildRef{TeamID: team, Build: b})
	}
	return out, rows.Err()
}

func normPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	n := norm(*t)
	return &n
}

func scanBuild(sc scanner) (client.TemplateBuild, string, error) {
	var b client.TemplateBuild
	var team string
	var created int64
	var started, finished sql.NullInt64
	err := sc.Scan(&b.ID, &team, &b.Template, &b.Kind, &b.State, &b.Digest, &b.Error, &b.FailedStep, &b.Steps,
		&b.CachedSteps, &b.BuiltSteps, &created, &started, &finished)
	if errors.Is(err, sql.ErrNoRows) {
		return client.TemplateBuild{}, "", ErrNotFound
	}
	if err != nil {
		return client.TemplateBuild{}, "", err
	}
	b.CreatedAt, b.StartedAt, b.FinishedAt = fromDB(created), timePtr(started), timePtr(finished)
	return b, team, nil
}
