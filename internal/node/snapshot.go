package node

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/evalbox/evalbox/internal/agentproto"
	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/internal/netrules"
	"github.com/evalbox/evalbox/internal/nodeapi"
	"github.com/evalbox/evalbox/internal/runtime"
	"github.com/evalbox/evalbox/internal/template"
	"github.com/evalbox/evalbox/pkg/client"
)

// Snapshots. A node keeps each snapshot in a directory of its own under
// Config.SnapshotDir, made whole or not at all (written as <id>.tmp, then
// renamed):
//
//	<id>/meta.json  what it is a snapshot of (SnapshotMeta)
//	<id>/image/     the runtime's checkpoint (gVisor: runsc's image files),
//	                or upper.tar, the sandbox's files (upperArchive)
//
// A runtime that can checkpoint (gVisor) snapshots memory, processes and
// files; one that can only export and import its copy-on-write layer
// (namespaces) snapshots the files, and a sandbox made from it boots
// afresh on them (its template's start and ready commands run again).
//
// Taking a checkpoint suspends the agent's session (agentproto.Client.Suspend) so
// that the image holds no call in flight, checkpoints the sandbox leaving
// it running, and resumes the session. A sandbox restored from it gets a
// session of its own over its new connection (agentproto.Redial).
//
// A pause is a checkpoint that stops the sandbox: its host processes,
// cgroup and link go, its capacity is given back, and the image waits in
// its state directory until Resume restores it under the same id.

// SnapshotMeta describes a snapshot a node holds.
type SnapshotMeta struct {
	ID string `json:"id"`
	// Source is the id of the sandbox it was taken of.
	Source string `json:"source"`
	// Spec is the source's: a sandbox restored from it has its template
	// (which must stay on the node), runtime and shape.
	Spec           nodeapi.Spec `json:"spec"`
	RuntimeVersion string       `json:"runtime_version"`
	// Memory is set when the snapshot holds memory and processes (gVisor),
	// not only files.
	Memory    bool      `json:"memory"`
	CreatedAt time.Time `json:"created_at"`
	// SizeBytes is its size on disk.
	SizeBytes int64 `json:"size_bytes"`
	// Nonce is the handover nonce the source's agent was suspended with.
	Nonce []byte `json:"nonce"`
	// ImageDigest is imageDigest of the image: a restore checks it, so
	// that a damaged image is refused rather than restored.
	ImageDigest string `json:"image_digest"`
	// Env is the source's environment (Sandbox.SetEnv), which sandboxes
	// made from the snapshot start with; never its secrets (SetSecrets),
	// which the snapshot does not keep. It is never logged; the file is
	// the node's alone, as the image is (whose memory holds the
	// processes' environment anyway).
	Env map[string]string `json:"env,omitempty"`
}

// Info is the contract's description of the snapshot.
func (m SnapshotMeta) Info() nodeapi.SnapshotInfo {
	return nodeapi.SnapshotInfo{ID: m.ID, Source: m.Source, Spec: m.Spec, RuntimeVersion: m.RuntimeVersion,
		Memory: m.Memory, SizeBytes: m.SizeBytes, CreatedAt: m.CreatedAt}
}

// upperArchive is the image of a snapshot of files: the sandbox's
// copy-on-write layer (runtime.UpperExporter).
const upperArchive = "upper.tar"

// snapshotSource is a snapshot a start restores from.
type snapshotSource struct {
	id, image string
	// memory: the image is a checkpoint (runtime.Restorer), else an
	// upperArchive (runtime.UpperImporter).
	memory bool
	nonce  []byte
	// egress is the new sandbox's rules, in force before its processes
	// run again.
	egress *netrules.Rules
}

// pauseImage is the checkpoint of a paused sandbox.
type pauseImage struct {
	dir   string
	nonce []byte
}

// snapshotIDPattern is the form of snapshot ids (NewSnapshotID).
var snapshotIDPattern = regexp.MustCompile(`^snap-[a-z2-7]{16}$`)

// NewSnapshotID returns a new random snapshot id.
func NewSnapshotID() string { return "snap-" + NewID()[len("sb-"):] }

// ValidSnapshotID reports whether id has the form of a snapshot id.
func ValidSnapshotID(id string) bool { return snapshotIDPattern.MatchString(id) }

// checkpointTimeout bounds one checkpoint or restore of the runtime.
const checkpointTimeout = 2 * time.Minute

// errNoCheckpoint is the error of a snapshot or pause of a sandbox whose
// runtime cannot checkpoint.
func errNoCheckpoint(sb *Sandbox, what string) error {
	return &apierr.Error{Code: client.CodeBadRequest,
		Message: fmt.Sprintf("%s of a %s sandbox is not supported: create the sandbox with runtime gvisor", what, sb.Runtime)}
}

func newNonce() []byte {
	b := make([]byte, agentproto.NonceSize)
	_, _ = rand.Read(b)
	return b
}

// liveSandbox returns the live sandbox id, not paused.
func (n *Node) liveSandbox(id string) (*Sandbox, error) {
	n.mu.Lock()
	sb := n.live[id]
	n.mu.Unlock()
	if sb == nil {
		return nil, fmt.Errorf("node: sandbox %s: %w", id, nodeapi.ErrSandboxNotFound)
	}
	return sb, nil
}

// errPaused is the error of an operation a paused sandbox cannot do.
func errPaused(id string) error {
	return &apierr.Error{Code: client.CodeSandboxNotRunning, Message: fmt.Sprintf("sandbox %s is paused", id)}
}

// Snapshot snapshots the running sandbox id: its files and, on gVisor, its
// memory and processes. With a checkpoint, calls in flight in it fail
// (foreground execs are killed, attaches and watches cut:
// agentproto.ErrSuspended) and calls made meanwhile wait; the sandbox goes
// on after it, and one whose session could not be resumed is destroyed.
// A snapshot of files only freezes the sandbox while they are read.
func (n *Node) Snapshot(ctx context.Context, id string) (SnapshotMeta, error) {
	sb, err := n.liveSandbox(id)
	if err != nil {
		return SnapshotMeta{}, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if sb.paused.Load() {
		return SnapshotMeta{}, errPaused(id)
	}
	cp, memory := sb.runtime().(runtime.Checkpointer)
	ex, files := sb.runtime().(runtime.UpperExporter)
	_, imports := n.runtimes[sb.Runtime].(runtime.UpperImporter)
	if !memory && !(files && imports) {
		return SnapshotMeta{}, errNoCheckpoint(sb, "a snapshot")
	}
	if n.cfg.SnapshotDir == "" {
		return SnapshotMeta{}, errors.New("node: no snapshot directory configured")
	}
	meta := SnapshotMeta{ID: NewSnapshotID(), Source: id, RuntimeVersion: sb.RuntimeVersion, Memory: memory,
		Spec: PoolKey{Template: sb.Template.Digest, Runtime: sb.Runtime, Shape: sb.Shape}, Nonce: newNonce(),
		Env: sb.BaseEnv()}
	tmp := filepath.Join(n.cfg.SnapshotDir, meta.ID+".tmp")
	if err := os.MkdirAll(filepath.Join(tmp, "image"), 0o700); err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = os.RemoveAll(tmp)
		}
	}()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
	defer cancel()
	if memory {
		if err := sb.Agent.Suspend(cctx, meta.Nonce); err != nil {
			n.lose(sb, "its session could not be suspended for a snapshot", err)
			return SnapshotMeta{}, fmt.Errorf("node: snapshot of %s: %w", id, err)
		}
		cerr := cp.Checkpoint(cctx, filepath.Join(tmp, "image"), true)
		if err := sb.Agent.Resume(nil); err != nil {
			n.lose(sb, "its session could not be resumed after a snapshot", err)
			return SnapshotMeta{}, fmt.Errorf("node: snapshot of %s: %w", id, errors.Join(cerr, err))
		}
		if cerr != nil {
			return SnapshotMeta{}, fmt.Errorf("node: snapshot of %s: %w", id, cerr)
		}
	} else if err := ex.ExportUpper(cctx, filepath.Join(tmp, "image", upperArchive)); err != nil {
		if errors.Is(err, runtime.ErrUpperTooLarge) {
			return SnapshotMeta{}, &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("snapshot of %s: %v", id, err)}
		}
		return SnapshotMeta{}, fmt.Errorf("node: snapshot of %s: %w", id, err)
	}
	meta.CreatedAt = time.Now().UTC()
	if meta.SizeBytes, err = template.DirSize(tmp); err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: snapshot of %s: %w", id, err)
	}
	if meta.ImageDigest, err = imageDigest(filepath.Join(tmp, "image")); err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: snapshot of %s: %w", id, err)
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), b, 0o600); err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(n.cfg.SnapshotDir, meta.ID)); err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: %w", err)
	}
	done = true
	n.log.Info("snapshot taken", "sandbox", id, "snapshot", meta.ID, "size_bytes", meta.SizeBytes)
	return meta, nil
}

// lose destroys a sandbox the node can no longer talk to.
func (n *Node) lose(sb *Sandbox, why string, err error) {
	n.log.Error("destroying a sandbox: "+why, "sandbox", sb.ID, "err", err)
	if derr := n.destroy(context.Background(), sb); derr != nil {
		n.log.Error("destroy sandbox", "sandbox", sb.ID, "err", derr)
	}
}

// SnapshotInfo reads the snapshot id's metadata (ErrSnapshotNotFound when
// the node has none of that id).
func (n *Node) SnapshotInfo(id string) (SnapshotMeta, error) {
	if !ValidSnapshotID(id) || n.cfg.SnapshotDir == "" {
		return SnapshotMeta{}, fmt.Errorf("node: snapshot %q: %w", id, nodeapi.ErrSnapshotNotFound)
	}
	b, err := os.ReadFile(filepath.Join(n.cfg.SnapshotDir, id, "meta.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return SnapshotMeta{}, fmt.Errorf("node: snapshot %s: %w", id, nodeapi.ErrSnapshotNotFound)
	}
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("node: %w", err)
	}
	var meta SnapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil || meta.ID != id || len(meta.Nonce) != agentproto.NonceSize || meta.ImageDigest == "" {
		n.log.Error("a snapshot's metadata is damaged", "snapshot", id, "err", err)
		return SnapshotMeta{}, errDamaged(id)
	}
	return meta, nil
}

// DeleteSnapshot removes the snapshot id (an unknown id is not an error).
// Sandboxes restored from it do not need it.
func (n *Node) DeleteSnapshot(id string) error {
	if !ValidSnapshotID(id) || n.cfg.SnapshotDir == "" {
		return nil
	}
	if err := os.RemoveAll(filepath.Join(n.cfg.SnapshotDir, id)); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// CreateFromSnapshot starts a sandbox restored from the snapshot id, once
// host capacity is reserved (queueing up to wait), with the snapshot's
// template, runtime, shape (which key must be unless it is zero) and
// environment (Sandbox.SetEnv). On error nothing is left.
func (n *Node) CreateFromSnapshot(ctx context.Context, id string, key PoolKey, wait time.Duration, egress *nodeapi.Egress) (*Sandbox, error) {
	meta, err := n.SnapshotInfo(id)
	if err != nil {
		return nil, err
	}
	if key != (PoolKey{}) && key != meta.Spec {
		return nil, &apierr.Error{Code: client.CodeBadRequest,
			Message: fmt.Sprintf("snapshot %s is of %s, not %s", id, meta.Spec, key)}
	}
	src := &snapshotSource{id: id, image: filepath.Join(n.cfg.SnapshotDir, id, "image"), memory: meta.Memory, nonce: meta.Nonce}
	if egress != nil {
		if meta.Spec.Shape.Network != runtime.NetworkOutbound {
			return nil, &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("snapshot %s has no network to set egress rules on", id)}
		}
		r, err := netrules.Parse(egress.Allow, egress.Deny)
		if err != nil {
			return nil, &apierr.Error{Code: client.CodeBadRequest, Message: err.Error()}
		}
		src.egress = r
	}
	if d, err := imageDigest(src.image); err != nil || d != meta.ImageDigest {
		n.log.Error("a snapshot's image is damaged", "snapshot", id, "err", err)
		return nil, errDamaged(id)
	}
	sb, err := n.start(ctx, meta.Spec, func(ctx context.Context, cost runtime.Resources) (func(), error) {
		return n.reserve(ctx, cost, wait)
	}, src)
	if err != nil {
		return nil, err
	}
	sb.SetEnv(meta.Env)
	sb.given.Store(true)
	return sb, nil
}

// OpenSnapshotFiles opens the files of the snapshot id as an archive of a
// copy-on-write layer (runtime.UpperExporter's format), for a template
// build that starts from it (from: snapshot:ID). A snapshot of files is its
// archive. A snapshot with memory is restored into a throwaway sandbox whose
// egress allows nothing, its layer exported to the sandbox's state
// directory, and the sandbox destroyed before this returns; the archive
// stays readable through the descriptor returned. It queues for host
// capacity up to wait.
func (n *Node) OpenSnapshotFiles(ctx context.Context, id string, wait time.Duration) (io.ReadCloser, error) {
	meta, err := n.SnapshotInfo(id)
	if err != nil {
		return nil, err
	}
	image := filepath.Join(n.cfg.SnapshotDir, id, "image")
	if d, err := imageDigest(image); err != nil || d != meta.ImageDigest {
		n.log.Error("a snapshot's image is damaged", "snapshot", id, "err", err)
		return nil, errDamaged(id)
	}
	if !meta.Memory {
		// Open before anything else can delete it: the descriptor keeps
		// the archive that was checked.
		f, err := os.Open(filepath.Join(image, upperArchive))
		if err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		return f, nil
	}
	src := &snapshotSource{id: id, image: image, memory: true, nonce: meta.Nonce}
	if meta.Spec.Shape.Network == runtime.NetworkOutbound {
		src.egress = &netrules.Rules{}
	}
	sb, err := n.start(ctx, meta.Spec, func(ctx context.Context, cost runtime.Resources) (func(), error) {
		return n.reserve(ctx, cost, wait)
	}, src)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := n.destroy(context.WithoutCancel(ctx), sb); err != nil {
			n.log.Error("destroy sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	ex, ok := sb.runtime().(runtime.UpperExporter)
	if !ok {
		return nil, fmt.Errorf("node: the %s runtime cannot export a sandbox's files", sb.Runtime)
	}
	path := filepath.Join(sb.stateDir, upperArchive)
	if err := ex.ExportUpper(ctx, path); err != nil {
		return nil, fmt.Errorf("node: the files of snapshot %s: %w", id, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	return f, nil
}

// Pause checkpoints the sandbox id and stops it: its memory and processes
// go to disk (its state directory), and it holds no host processes,
// memory or capacity until Resume. Calls made to it meanwhile wait. A
// sandbox whose pause failed midway is destroyed.
func (n *Node) Pause(ctx context.Context, id string) error {
	sb, err := n.liveSandbox(id)
	if err != nil {
		return err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if sb.paused.Load() {
		return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("sandbox %s is already paused", id)}
	}
	rt := sb.runtime()
	cp, ok := rt.(runtime.Checkpointer)
	if !ok {
		return errNoCheckpoint(sb, "a pause")
	}
	img := &pauseImage{dir: filepath.Join(sb.stateDir, "pause-"+NewID()[len("sb-"):]), nonce: newNonce()}
	if err := os.Mkdir(img.dir, 0o700); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
	defer cancel()
	if err := sb.Agent.Suspend(cctx, img.nonce); err != nil {
		n.lose(sb, "its session could not be suspended for a pause", err)
		return fmt.Errorf("node: pause of %s: %w", id, err)
	}
	if err := cp.Checkpoint(cctx, img.dir, false); err != nil {
		// The checkpoint may have stopped it: it cannot be trusted.
		n.lose(sb, "its pause failed", err)
		return fmt.Errorf("node: pause of %s: %w", id, err)
	}
	if err := rt.Destroy(cctx); err != nil {
		// What is left of it would hold host pids and memory that the
		// pause gives back (and the sweep keeps a live id's): the whole
		// sandbox goes, its capacity held until the sweep removed it.
		n.lose(sb, "its stopped sandbox could not be removed at a pause", err)
		return fmt.Errorf("node: pause of %s: %w", id, err)
	}
	sb.pause = img
	sb.paused.Store(true)
	sb.Agent.Park() // its calls in the meantime fail, they do not wait for the resume
	n.mu.Lock()
	release := sb.release
	sb.release = nil
	n.mu.Unlock()
	if release != nil {
		release()
	}
	n.log.Info("sandbox paused", "sandbox", id)
	return nil
}

// Resume restores a paused sandbox under its id, once host capacity is
// reserved (queueing up to wait), and resumes its agent's session. When
// the restore fails it stays paused (and can be resumed again); when its
// agent does not answer after it, it is destroyed.
func (n *Node) Resume(ctx context.Context, id string, wait time.Duration) error {
	sb, err := n.liveSandbox(id)
	if err != nil {
		return err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if !sb.paused.Load() {
		return &apierr.Error{Code: client.CodeConflict, Message: fmt.Sprintf("sandbox %s is not paused", id)}
	}
	rt := n.runtimes[sb.Runtime]
	rr, ok := rt.(runtime.Restorer)
	if !ok {
		return errNoCheckpoint(sb, "a resume")
	}
	key := PoolKey{Template: sb.Template.Digest, Runtime: sb.Runtime, Shape: sb.Shape}
	cost, err := hostCost(rt, key.Shape)
	if err != nil {
		return err
	}
	release, err := n.reserve(ctx, cost, wait)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
	defer cancel()
	spec := runtimeSpec(id, sb.Template, key, sb.stateDir, n.cfg.AgentPath)
	spec.Egress = sb.egress.Load() // in force before its processes run again
	rsb, err := rr.Restore(cctx, spec, sb.pause.dir)
	if err != nil {
		release()
		return fmt.Errorf("node: resume of %s: %w", id, err)
	}
	sb.rtMu.Lock()
	if sb.destroyed.Load() {
		// Destroyed while it was restored (a delete, its TTL): what the
		// restore made is this call's to remove.
		sb.rtMu.Unlock()
		_ = rsb.Destroy(context.WithoutCancel(ctx))
		release()
		return fmt.Errorf("node: sandbox %s: %w", id, nodeapi.ErrSandboxNotFound)
	}
	sb.rt = rsb
	n.mu.Lock()
	sb.release = release
	n.mu.Unlock()
	sb.rtMu.Unlock()
	if err := sb.Agent.Resume(rsb.Conn()); err == nil {
		err = sb.Agent.Ping(cctx)
	}
	if err != nil {
		n.lose(sb, "its agent did not answer after a resume", err)
		return fmt.Errorf("node: resume of %s: the agent did not answer: %w", id, err)
	}
	if err := os.RemoveAll(sb.pause.dir); err != nil {
		n.log.Warn("resume: removing the pause image", "sandbox", id, "err", err)
	}
	sb.pause = nil
	sb.paused.Store(false)
	n.log.Info("sandbox resumed", "sandbox", id)
	return nil
}

// sweepSnapshots removes what snapshots cut short left (a <id>.tmp
// directory older than a checkpoint can take).
func (n *Node) sweepSnapshots() []error {
	if n.cfg.SnapshotDir == "" {
		return nil
	}
	entries, _ := os.ReadDir(n.cfg.SnapshotDir)
	var errs []error
	for _, e := range entries {
		id, tmp := strings.CutSuffix(e.Name(), ".tmp")
		if !tmp || !ValidSnapshotID(id) {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < 2*checkpointTimeout {
			continue
		}
		if err := os.RemoveAll(filepath.Join(n.cfg.SnapshotDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// errDamaged is the error of a restore from a snapshot whose files were
// changed or cut on disk.
func errDamaged(id string) error {
	return &apierr.Error{Code: client.CodeConflict,
		Message: fmt.Sprintf("snapshot %s is damaged on disk (its files do not match what was written): delete it", id)}
}

// imageDigest is the sha256 of an image directory's regular files: each
// one's name, size and bytes, by name.
func imageDigest(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, e := range entries { // sorted by name
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", err
		}
		fi, err := f.Stat()
		if err == nil {
			fmt.Fprintf(h, "%s\x00%d\x00", e.Name(), fi.Size())
			_, err = io.Copy(h, f)
		}
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
