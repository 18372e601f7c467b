package nodeagent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/evalbox/evalbox/internal/fleet/membership"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/template"
)

// fetchTimeout bounds one template fetch.
const fetchTimeout = 30 * time.Minute

// fetcher fetches templates from the control plane into the node's store.
// Concurrent fetches of one template are one fetch: the first caller's
// starts it, under the agent's lifetime (a caller that gives up does not
// end it for the others), and every caller waits for its end or gives up.
type fetcher struct {
	life    context.Context
	base    string
	token   string
	client  *http.Client
	reg     *template.Registry
	max     int64
	log     *slog.Logger
	onAdded func() error

	mu    sync.Mutex
	calls map[string]*fetchCall // by digest and content digest
}

type fetchCall struct {
	done chan struct{}
	err  error
}

func newFetcher(life context.Context, base, token string, tlsCfg *tls.Config, reg *template.Registry, max int64, log *slog.Logger, onAdded func() error) *fetcher {
	client := &http.Client{}
	if tlsCfg != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsCfg
		client.Transport = tr
	}
	return &fetcher{life: life, base: strings.TrimSuffix(base, "/"), token: token, reg: reg, max: max, log: log,
		onAdded: onAdded, client: client, calls: map[string]*fetchCall{}}
}

// fetch makes the node hold the template of digest, whose export stream
// must hash to contentDigest. On error the node holds nothing new.
func (f *fetcher) fetch(ctx context.Context, digest, contentDigest string) error {
	key := digest + " " + contentDigest
	f.mu.Lock()
	c, ok := f.calls[key]
	if !ok {
		c = &fetchCall{done: make(chan struct{})}
		f.calls[key] = c
		go func() {
			c.err = f.do(digest, contentDigest)
			f.mu.Lock()
			delete(f.calls, key)
			f.mu.Unlock()
			close(c.done)
		}()
	}
	f.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fetcher) do(digest, contentDigest string) error {
	ctx, cancel := context.WithTimeout(f.life, fetchTimeout)
	defer cancel()
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.base+nodeapi.TemplatePath(digest), nil)
	if err != nil {
		return fmt.Errorf("nodeagent: fetch %s: %w", digest, err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("nodeagent: fetch %s: %w", digest, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("nodeagent: fetch %s: the control plane answered %s", digest, resp.Status)
	}
	if got := resp.Header.Get(nodeapi.HeaderContentDigest); got != "" && got != contentDigest {
		return fmt.Errorf("nodeagent: fetch %s: %w: the control plane sends %s, the create asks for %s",
			digest, template.ErrContentMismatch, got, contentDigest)
	}
	body := &countingReader{r: resp.Body}
	if _, err := f.reg.AddFetched(ctx, digest, contentDigest, body, f.max); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	secs := time.Since(start).Seconds()
	f.log.Info("template fetched", "template", digest, "bytes", body.n, "seconds", fmt.Sprintf("%.2f", secs),
		"mb_per_s", fmt.Sprintf("%.1f", float64(body.n)/1e6/max(secs, 1e-9)))
	if f.onAdded != nil {
		if err := f.onAdded(); err != nil {
			f.log.Warn("listing templates", "err", err)
		}
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// observedLeases closes first when a write of the Lease succeeded: the
// node is in the cluster from then on.
type observedLeases struct {
	membership.Leases
	first chan struct{}
	once  sync.Once
}

func (o *observedLeases) wrote() { o.once.Do(func() { close(o.first) }) }

func (o *observedLeases) Create(ctx context.Context, l *coordv1.Lease, opts metav1.CreateOptions) (*coordv1.Lease, error) {
	got, err := o.Leases.Create(ctx, l, opts)
	if err == nil {
		o.wrote()
	}
	return got, err
}

func (o *observedLeases) Update(ctx context.Context, l *coordv1.Lease, opts metav1.UpdateOptions) (*coordv1.Lease, error) {
	got, err := o.Leases.Update(ctx, l, opts)
	if err == nil {
		o.wrote()
	}
	return got, err
}
