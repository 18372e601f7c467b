package e2b

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

// The files of the template builds' COPY steps: the SDK asks whether the
// server has them (by the hash it computed of them), and if not PUTs them
// as a tar to the URL it was given. That URL carries its own credential
// (the SDK sends no key with the upload): a signature of the team, the
// hash and an expiry.

// uploadPath is where uploads go (outside E2B's own routes).
const uploadPath = "/e2b/uploads/"

// purposeUpload is the upload URLs' token purpose.
const purposeUpload = "e2b-upload"

var hashRE = regexp.MustCompile(`^[0-9a-f]{16,128}$`)

func validHash(h string) bool { return hashRE.MatchString(h) }

// fileCache keeps the uploads, per team, for pendingTTL after their last
// use; a team's together at most max bytes (its oldest go first).
type fileCache struct {
	dir string
	max func() int64

	mu       sync.Mutex
	inFlight map[string]int // uploads running, by team
}

func (c *fileCache) path(team, hash string) string {
	return filepath.Join(c.dir, team, hash+".tar")
}

// present reports whether the team has the upload, and keeps it longer.
func (c *fileCache) present(team, hash string) bool {
	if c.dir == "" || !validHash(hash) {
		return false
	}
	p := c.path(team, hash)
	fi, err := os.Stat(p)
	if err != nil || time.Since(fi.ModTime()) > pendingTTL {
		return false
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now)
	return true
}

// maxUploadsInFlight bounds a team's uploads at once (each may write up
// to a build context's limit before it is checked against the rest).
const maxUploadsInFlight = 4

// put stores an upload of size bytes (-1: unknown) from r, checking that
// it is a tar archive (gzipped or not) whose names stay inside it. The
// first upload of a hash wins: a later one (the same files, or not) is
// read and dropped, so that an upload URL cannot replace what builds use.
func (c *fileCache) put(team, hash string, r io.Reader, size int64) error {
	if c.dir == "" {
		return errorf(client.CodeNotImplemented, "this server keeps no template uploads")
	}
	max := c.max()
	if size > max {
		return errorf(client.CodePayloadTooLarge, "the upload is %d bytes; a build context is at most %d", size, max)
	}
	if !c.enter(team) {
		return apierr.Errorf(client.CodeRateLimited, "the team has %d uploads running; wait for one to end", maxUploadsInFlight)
	}
	defer c.leave(team)
	dir := filepath.Join(c.dir, team)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("e2b: uploads: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return fmt.Errorf("e2b: uploads: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	lr := &io.LimitedReader{R: r, N: max + 1}
	if err := checkTar(io.TeeReader(lr, tmp)); err != nil {
		if lr.N <= 0 {
			return errorf(client.CodePayloadTooLarge, "the upload is over %d bytes (a build context's limit)", max)
		}
		return errorf(client.CodeBadRequest, "the upload is not a tar archive of the step's files: %v", err)
	}
	// What follows the archive's end is read too (and kept: it is ignored).
	if _, err := io.Copy(tmp, lr); err != nil {
		return fmt.Errorf("e2b: uploads: %w", err)
	}
	if lr.N <= 0 {
		return errorf(client.CodePayloadTooLarge, "the upload is over %d bytes (a build context's limit)", max)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("e2b: uploads: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	final := c.path(team, hash)
	if fi, err := os.Stat(final); err == nil && time.Since(fi.ModTime()) <= pendingTTL {
		return nil // the first upload stays
	}
	_ = os.Remove(final) // expired
	if err := os.Link(tmp.Name(), final); err != nil {
		return fmt.Errorf("e2b: uploads: %w", err)
	}
	c.evict(dir, max, final)
	return nil
}

// enter counts an upload of the team in, if it has room.
func (c *fileCache) enter(team string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inFlight == nil {
		c.inFlight = map[string]int{}
	}
	if c.inFlight[team] >= maxUploadsInFlight {
		return false
	}
	c.inFlight[team]++
	return true
}

func (c *fileCache) leave(team string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inFlight[team]--; c.inFlight[team] <= 0 {
		delete(c.inFlight, team)
	}
}

// evict removes a team's expired uploads and stale temporary files, then
// its oldest uploads (never keep) until they take at most max bytes.
func (c *fileCache) evict(dir string, max int64, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type file struct {
		p    string
		size int64
		mod  time.Time
	}
	var files []file
	var total int64
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if time.Since(fi.ModTime()) > pendingTTL {
			_ = os.Remove(p) // expired, or a temporary file a crash left
			continue
		}
		if !strings.HasSuffix(e.Name(), ".tar") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		total += fi.Size()
		if p != keep {
			files = append(files, file{p, fi.Size(), fi.ModTime()})
		}
	}
	for total > max && len(files) > 0 {
		oldest := 0
		for i, f := range files {
			if f.mod.Before(files[oldest].mod) {
				oldest = i
			}
		}
		_ = os.Remove(files[oldest].p)
		total -= files[oldest].size
		files = append(files[:oldest], files[oldest+1:]...)
	}
}

// archive opens an upload as a tar stream (gunzipped when it is gzip).
func archive(f io.Reader) (*tar.Reader, func() error, error) {
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return tar.NewReader(zr), zr.Close, nil
	}
	return tar.NewReader(br), func() error { return nil }, nil
}

// eachEntry calls fn with each entry of an upload (gunzipped when it is
// gzip) and its clean name ("" for the root), refusing names, and hard
// links' targets, that leave the archive.
func eachEntry(r io.Reader, fn func(hdr *tar.Header, name string, body io.Reader) error) error {
	tr, done, err := archive(r)
	if err != nil {
		return err
	}
	defer done()
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeLink {
			if ln, err := cleanName(hdr.Linkname); err != nil || ln == "" {
				return fmt.Errorf("hard link %q to %q: not a file of the archive", hdr.Name, hdr.Linkname)
			}
		}
		if err := fn(hdr, name, tr); err != nil {
			return err
		}
	}
}

// checkTar reads a whole archive, refusing names that leave it.
func checkTar(r io.Reader) error {
	return eachEntry(r, func(_ *tar.Header, _ string, body io.Reader) error {
		_, err := io.Copy(io.Discard, body)
		return err
	})
}

// cleanName is an archive name, clean and relative ("" for the root).
func cleanName(name string) (string, error) {
	if strings.HasPrefix(name, "/") || hasDotDot(name) {
		return "", fmt.Errorf("%q leaves the archive", name)
	}
	return strings.TrimPrefix(path.Clean("/"+name), "/"), nil
}

func hasDotDot(name string) bool {
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// writeContext writes the build context of uploads as one tar: each
// upload's files under a directory named by its hash.
func (c *fileCache) writeContext(w io.Writer, team string, hashes []string) error {
	tw := tar.NewWriter(w)
	for _, hash := range hashes {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: hash + "/", Mode: 0o755}); err != nil {
			return err
		}
		if err := c.copyInto(tw, team, hash); err != nil {
			return err
		}
	}
	return tw.Close()
}

func (c *fileCache) copyInto(tw *tar.Writer, team, hash string) error {
	f, err := os.Open(c.path(team, hash))
	if err != nil {
		return fmt.Errorf("e2b: the files of %s: %w", hash, err)
	}
	defer f.Close()
	return eachEntry(f, func(hdr *tar.Header, name string, body io.Reader) error {
		if name == "" {
			return nil
		}
		hdr.Name = hash + "/" + name
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if hdr.Typeflag == tar.TypeLink {
			ln, _ := cleanName(hdr.Linkname)
			hdr.Linkname = hash + "/" + ln
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := io.Copy(tw, body)
		return err
	})
}

type fileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// uploadTTL is how long an upload URL works.
const uploadTTL = time.Hour

// fileUploadLink is GET /templates/{id}/files/{hash}: present, or where
// to upload.
func (h *Handler) fileUploadLink(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.templatesOff(w) {
		return
	}
	hash := r.PathValue("hash")
	if !validHash(hash) {
		h.writeError(w, errorf(client.CodeBadRequest, "files hash %q: want the SDK's hex hash", hash))
		return
	}
	if h.files.present(p.TeamID, hash) {
		writeJSON(w, http.StatusCreated, fileUpload{Present: true})
		return
	}
	key, err := h.secret(r.Context())
	if err != nil {
		h.writeError(w, err)
		return
	}
	exp := strconv.FormatInt(time.Now().Add(uploadTTL).Unix(), 10)
	q := url.Values{"exp": {exp}, "sig": {derive(key, purposeUpload, p.TeamID, hash, exp)}}
	u := url.URL{Scheme: "http", Host: r.Host, Path: uploadPath + p.TeamID + "/" + hash, RawQuery: q.Encode()}
	if r.TLS != nil {
		u.Scheme = "https"
	}
	if pu, err := url.Parse(h.cfg.PublicURL); err == nil && h.cfg.PublicURL != "" {
		u.Scheme, u.Host = pu.Scheme, pu.Host // behind a proxy: as clients reach the server
	}
	writeJSON(w, http.StatusCreated, fileUpload{URL: u.String()})
}

// uploadFile is the PUT of an upload URL.
func (h *Handler) uploadFile(w http.ResponseWriter, r *http.Request) {
	if h.templatesOff(w) {
		return
	}
	team, hash := r.PathValue("team"), r.PathValue("hash")
	exp, sig := r.URL.Query().Get("exp"), r.URL.Query().Get("sig")
	key, err := h.secret(r.Context())
	if err != nil {
		h.writeError(w, err)
		return
	}
	t, perr := strconv.ParseInt(exp, 10, 64)
	if perr != nil || !validHash(hash) || !equal(sig, derive(key, purposeUpload, team, hash, exp)) {
		h.writeError(w, errorf(client.CodeUnauthorized, "this upload URL is not valid (ask GET /templates/{id}/files/{hash} for one)"))
		return
	}
	if time.Now().Unix() > t {
		h.writeError(w, errorf(client.CodeUnauthorized, "this upload URL expired (ask GET /templates/{id}/files/{hash} for a new one)"))
		return
	}
	if err := h.files.put(team, hash, r.Body, r.ContentLength); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
