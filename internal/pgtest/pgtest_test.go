package pgtest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestServerLifecycle: a server accepts its DSN (and not a wrong
// password), runs as a user other than root, and leaves no process and no
// file once stopped.
func TestServerLifecycle(t *testing.T) {
	ctx := t.Context()
	s, err := NewServer(ctx)
	if errors.Is(err, ErrNoBinaries) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	dsn, err := s.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRow(ctx, "SELECT 1 + 1").Scan(&n); err != nil || n != 2 {
		t.Fatalf("query: %d, %v", n, err)
	}
	c.Close(ctx)
	if bad, err := pgx.Connect(ctx, strings.Replace(dsn, s.Password(), "wrong", 1)); err == nil {
		bad.Close(ctx)
		t.Fatal("a wrong password was accepted")
	}
	fi, err := os.Stat("/proc/" + strconv.Itoa(s.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == 0 {
		t.Error("postgres runs as root")
	}
	if err := s.DropDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	pid, dir := s.Pid(), s.Dir()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postmaster %d still there after Stop: %v", pid, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after Stop: %v", dir, err)
	}
	if left := processGroup(pid); len(left) > 0 {
		t.Errorf("processes left in the server's group %d: %v", pid, left)
	}
}

// TestStart: Start's database is usable within the test.
func TestStart(t *testing.T) {
	dsn := Start(t)
	c, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(t.Context(), "CREATE TABLE x (id bigint)"); err != nil {
		t.Fatal(err)
	}
}

func TestBinDirFromEnv(t *testing.T) {
	t.Setenv(EnvBinDir, t.TempDir())
	if _, err := BinDir(); err == nil || errors.Is(err, ErrNoBinaries) {
		t.Fatalf("BinDir with an empty %s: %v; want an error that fails the test, not one that skips it", EnvBinDir, err)
	}
}

// processGroup lists the processes of process group pgid (the
// postmaster's: its backends are in it).
func processGroup(pgid int) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			out = append(out, e.Name())
		}
	}
	return out
}
