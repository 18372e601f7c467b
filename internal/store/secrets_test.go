package store

import (
	"bytes"
	"context"
	"sync"
	"testing"
)

// TestServerSecret: one secret per name, made once even by callers racing
// on several Stores of one database, and kept.
func TestServerSecret(t *testing.T) {
	forEachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		stores := openN(t, dsn, 3)
		got := make([][]byte, 6)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				v, err := stores[i%len(stores)].ServerSecret(ctx, "e2b")
				if err != nil {
					t.Error(err)
				}
				got[i] = v
			})
		}
		wg.Wait()
		for _, v := range got {
			if len(v) != 32 || !bytes.Equal(v, got[0]) {
				t.Fatalf("secrets differ or are short: %x", got)
			}
		}
		other, err := stores[0].ServerSecret(ctx, "other")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(other, got[0]) {
			t.Fatal("two names share a secret")
		}
	})
}
