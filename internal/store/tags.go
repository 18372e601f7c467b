package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// TagRow is a tag of a team's template: "name:tag" names the digest of
// one build, as the templates row names the digest of the untagged name.
type TagRow struct {
	TeamID    string
	Template  string
	Tag       string
	Digest    string
	BuildID   string
	CreatedAt time.Time
}

const tagCols = `team_id, template, tag, digest, build_id, created_at`

// PutTag points a tag of the team's template at a digest and returns the
// digest it replaced ("" if none). Concurrent puts of one tag each return
// the digest of the one before, as PutTemplate's do.
func (s *Store) PutTag(ctx context.Context, t TagRow) (string, error) {
	if t.TeamID == "" || t.Template == "" || t.Tag == "" || t.Digest == "" {
		return "", errors.New("store: put tag: team, template, tag and digest are required")
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now()
	}
	old, err := s.repoint(ctx,
		`SELECT digest FROM template_tags WHERE team_id = ? AND template = ? AND tag = ?`, []any{t.TeamID, t.Template, t.Tag},
		`UPDATE template_tags SET digest = ?, build_id = ?, created_at = ? WHERE team_id = ? AND template = ? AND tag = ?`,
		[]any{t.Digest, t.BuildID, toDB(norm(t.CreatedAt)), t.TeamID, t.Template, t.Tag},
		`INSERT INTO template_tags (`+tagCols+`) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (team_id, template, tag) DO NOTHING`,
		[]any{t.TeamID, t.Template, t.Tag, t.Digest, t.BuildID, toDB(norm(t.CreatedAt))})
	if err != nil {
		return "", fmt.Errorf("store: put tag %s:%s: %w", t.Template, t.Tag, s.mapConstraint(err, "team"))
	}
	return old, nil
}

// GetTag returns a tag of the team's template; an unknown one (or
// another team's) is ErrNotFound.
func (s *Store) GetTag(ctx context.Context, teamID, template, tag string) (TagRow, error) {
	t, err := scanTag(s.queryRow(ctx, `SELECT `+tagCols+` FROM template_tags WHERE team_id = ? AND template = ? AND tag = ?`,
		teamID, template, tag))
	if err != nil {
		return TagRow{}, fmt.Errorf("store: get tag %s:%s: %w", template, tag, err)
	}
	return t, nil
}

// ListTags returns the tags of the team's template by tag, or, for
// template "", every tag of the team by template and tag.
func (s *Store) ListTags(ctx context.Context, teamID, template string) ([]TagRow, error) {
	q, args := `SELECT `+tagCols+` FROM template_tags WHERE team_id = ? AND template = ? ORDER BY tag`, []any{teamID, template}
	if template == "" {
		q, args = `SELECT `+tagCols+` FROM template_tags WHERE team_id = ? ORDER BY template, tag`, []any{teamID}
	}
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list tags: %w", err)
	}
	defer rows.Close()
	var out []TagRow
	for rows.Next() {
		t, err := scanTag(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list tags: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTag removes a tag of the team's template and returns the digest
// it pointed at; an unknown tag is ErrNotFound.
func (s *Store) DeleteTag(ctx context.Context, teamID, template, tag string) (string, error) {
	var digest string
	err := s.writeRow(ctx, `DELETE FROM template_tags WHERE team_id = ? AND template = ? AND tag = ? RETURNING digest`,
		teamID, template, tag).Scan(&digest)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: delete tag %s:%s: %w", template, tag, err)
	}
	return digest, nil
}

func scanTag(sc scanner) (TagRow, error) {
	var t TagRow
	var created int64
	err := sc.Scan(&t.TeamID, &t.Template, &t.Tag, &t.Digest, &t.BuildID, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return TagRow{}, ErrNotFound
	}
	if err != nil {
		return TagRow{}, err
	}
	t.CreatedAt = fromDB(created)
	return t, nil
}
