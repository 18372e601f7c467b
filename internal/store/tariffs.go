package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Tariff is a named sandbox shape and its prices per second, in nano-units
// of the currency (internal/meter formats them): for each vCPU, for each
// GiB of memory, and for each GiB of disk.
type Tariff struct {
	Name               string
	CPU                float64
	MemoryMB           int
	DiskMB             int
	PriceVCPUSecond    int64
	PriceGiBSecond     int64
	PriceDiskGiBSecond int64
	// CPUAbuseThreshold and CPUAbuseWindow are the CPU-abuse rule of its
	// sandboxes (nil: the server's; a zero window: none).
	CPUAbuseThreshold *float64
	CPUAbuseWindow    *time.Duration
	CreatedAt         time.Time
	UpdatedAt         time.Time
}

const tariffCols = `name, cpu, memory_mb, disk_mb, price_vcpu_second, price_gib_second, price_disk_gib_second,
	cpu_abuse_threshold, cpu_abuse_window_us, created_at, updated_at`

func scanTariff(sc scanner) (Tariff, error) {
	var t Tariff
	var created, updated int64
	var threshold sql.NullFloat64
	var window sql.NullInt64
	err := sc.Scan(&t.Name, &t.CPU, &t.MemoryMB, &t.DiskMB, &t.PriceVCPUSecond, &t.PriceGiBSecond, &t.PriceDiskGiBSecond,
		&threshold, &window, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return Tariff{}, ErrNotFound
	}
	if threshold.Valid {
		t.CPUAbuseThreshold = &threshold.Float64
	}
	if window.Valid {
		d := time.Duration(window.Int64) * time.Microsecond
		t.CPUAbuseWindow = &d
	}
	t.CreatedAt, t.UpdatedAt = fromDB(created), fromDB(updated)
	return t, err
}

// abuseArgs are a tariff's CPU-abuse columns.
func (t Tariff) abuseArgs() (sql.NullFloat64, sql.NullInt64) {
	var th sql.NullFloat64
	var w sql.NullInt64
	if t.CPUAbuseThreshold != nil {
		th = sql.NullFloat64{Float64: *t.CPUAbuseThreshold, Valid: true}
	}
	if t.CPUAbuseWindow != nil {
		w = sql.NullInt64{Int64: t.CPUAbuseWindow.Microseconds(), Valid: true}
	}
	return th, w
}

// PutTariff stores a tariff, replacing one of that name (its CreatedAt is
// kept). It reports whether the name was new. Sandboxes keep the prices
// they were created with.
func (s *Store) PutTariff(ctx context.Context, t Tariff) (bool, error) {
	at := toDB(norm(time.Now()))
	th, w := t.abuseArgs()
	res, err := s.exec(ctx, `UPDATE tariffs SET cpu = ?, memory_mb = ?, disk_mb = ?, price_vcpu_second = ?, price_gib_second = ?,
		price_disk_gib_second = ?, cpu_abuse_threshold = ?, cpu_abuse_window_us = ?, updated_at = ? WHERE name = ?`,
		t.CPU, t.MemoryMB, t.DiskMB, t.PriceVCPUSecond, t.PriceGiBSecond, t.PriceDiskGiBSecond, th, w, at, t.Name)
	if err != nil {
		return false, fmt.Errorf("store: put tariff %s: %w", t.Name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, fmt.Errorf("store: put tariff %s: %w", t.Name, err)
	} else if n == 1 {
		return false, nil
	}
	_, err = s.exec(ctx, `INSERT INTO tariffs (`+tariffCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET cpu = excluded.cpu, memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb,
		price_vcpu_second = excluded.price_vcpu_second, price_gib_second = excluded.price_gib_second,
		price_disk_gib_second = excluded.price_disk_gib_second, cpu_abuse_threshold = excluded.cpu_abuse_threshold,
		cpu_abuse_window_us = excluded.cpu_abuse_window_us, updated_at = excluded.updated_at`,
		t.Name, t.CPU, t.MemoryMB, t.DiskMB, t.PriceVCPUSecond, t.PriceGiBSecond, t.PriceDiskGiBSecond, th, w, at, at)
	if err != nil {
		return false, fmt.Errorf("store: put tariff %s: %w", t.Name, err)
	}
	return true, nil
}

// GetTariff returns the tariff of this name (ErrNotFound: none).
func (s *Store) GetTariff(ctx context.Context, name string) (Tariff, error) {
	t, err := scanTariff(s.queryRow(ctx, `SELECT `+tariffCols+` FROM tariffs WHERE name = ?`, name))
	if err != nil {
		return Tariff{}, fmt.Errorf("store: tariff %s: %w", name, err)
	}
	return t, nil
}

// ListTariffs returns the tariffs by name.
func (s *Store) ListTariffs(ctx context.Context) ([]Tariff, error) {
	rows, err := s.query(ctx, `SELECT `+tariffCols+` FROM tariffs ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list tariffs: %w", err)
	}
	defer rows.Close()
	var out []Tariff
	for rows.Next() {
		t, err := scanTariff(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list tariffs: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list tariffs: %w", err)
	}
	return out, nil
}

// DeleteTariff removes a tariff (ErrNotFound: none). Sandboxes and usage
// of it keep its name and the prices they had.
func (s *Store) DeleteTariff(ctx context.Context, name string) error {
	res, err := s.exec(ctx, `DELETE FROM tariffs WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("store: delete tariff %s: %w", name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store: delete tariff %s: %w", name, err)
	} else if n == 0 {
		return fmt.Errorf("store: delete tariff %s: %w", name, ErrNotFound)
	}
	return nil
}
