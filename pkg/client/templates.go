package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
)

// ListTemplates lists the templates sandboxes can be created from: the
// built-ins and the team's own.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	l, err := c.ListTemplatesUsage(ctx)
	if err != nil {
		return nil, err
	}
	return l.Templates, nil
}

// ListTemplatesUsage is ListTemplates with the disk usage of the server's
// template store.
func (c *Client) ListTemplatesUsage(ctx context.Context) (*TemplateList, error) {
	var l TemplateList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/templates", retry: true}, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetTemplate returns a template by name.
func (c *Client) GetTemplate(ctx context.Context, name string) (*Template, error) {
	if err := checkIDs(name); err != nil {
		return nil, err
	}
	var t Template
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/templates/" + seg(name), retry: true}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate deletes one of the team's templates (a conflict while
// running sandboxes use it).
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	if err := checkIDs(name); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: "/templates/" + seg(name), retry: true}, nil)
}

// TemplateTags lists the tags of one of the team's templates, "default"
// (the untagged name) first.
func (c *Client) TemplateTags(ctx context.Context, name string) (*TemplateTagList, error) {
	if err := checkIDs(name); err != nil {
		return nil, err
	}
	var out TemplateTagList
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/templates/" + seg(name) + "/tags", retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TagTemplate points tags of a template at what target (a tag of it, or
// a build id) names, and returns the template's tags after. Retried: the
// same request twice points the tags at the same build.
func (c *Client) TagTemplate(ctx context.Context, name, target string, tags ...string) (*TemplateTagList, error) {
	if err := checkIDs(name); err != nil {
		return nil, err
	}
	var out TemplateTagList
	if err := c.do(ctx, &request{method: http.MethodPost, path: "/templates/" + seg(name) + "/tags", retry: true,
		in: &TagTemplateRequest{Target: target, Tags: tags}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// BuildTemplate starts a build of req.Spec as the template req.Name and
// returns the queued build; FollowBuild streams its log and waits for its
// end. buildContext, when not nil, is the build context as a tar archive
// (the files the spec's copy steps take, relative to its root); it is
// streamed, never held in memory whole. Not retried.
func (c *Client) BuildTemplate(ctx context.Context, req BuildTemplateRequest, buildContext io.Reader) (*TemplateBuild, error) {
	var b TemplateBuild
	if buildContext == nil {
		if err := c.do(ctx, &request{method: http.MethodPost, path: "/templates", in: &req}, &b); err != nil {
			return nil, err
		}
		return &b, nil
	}
	payload, err := json.Marshal(&req)
	if err != nil {
		return nil, fmt.Errorf("evalbox: encoding the build request: %w", err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := writeBuildBody(mw, payload, buildContext)
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	err = c.do(ctx, &request{method: http.MethodPost, path: "/templates", raw: pr, rawSize: -1,
		rawType: mw.FormDataContentType()}, &b)
	// The server may answer before reading everything (a refused build).
	pr.CloseWithError(errors.New("evalbox: request done"))
	if err != nil {
		return nil, err
	}
	return &b, nil
}

func writeBuildBody(mw *multipart.Writer, payload []byte, buildContext io.Reader) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="request"`)
	h.Set("Content-Type", ContentTypeJSON)
	w, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	h = textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="context"; filename="context.tar"`)
	h.Set("Content-Type", ContentTypeTar)
	if w, err = mw.CreatePart(h); err != nil {
		return err
	}
	_, err = io.Copy(w, buildContext)
	return err
}

// ImportOptions say what to import. Name is required; then either an
// archive is passed to ImportTemplate, or Image names a registry reference.
type ImportOptions struct {
	Name string
	// Ref picks one image of an archive or layout that holds several (a
	// tag, ref name annotation or manifest digest).
	Ref string
	// Image is a registry reference (e.g. docker.io/library/python:3.12)
	// to pull instead of uploading an archive.
	Image string
}

// ImportTemplate starts importing an OCI image as a template: archive is
// a docker-archive tarball (`docker save`) or an OCI image layout packed
// as a tar archive, size its length (-1 unknown); nil with o.Image set
// pulls from a registry. It returns the queued import; FollowBuild
// streams its log. Not retried.
func (c *Client) ImportTemplate(ctx context.Context, o ImportOptions, archive io.Reader, size int64) (*TemplateBuild, error) {
	q := url.Values{"name": {o.Name}}
	if o.Ref != "" {
		q.Set("ref", o.Ref)
	}
	if o.Image != "" {
		q.Set("image", o.Image)
	}
	r := &request{method: http.MethodPost, path: "/templates/import", query: q, raw: archive, rawSize: size, rawType: ContentTypeTar}
	if archive == nil {
		r.raw, r.rawSize, r.rawType = nil, 0, ""
	}
	var b TemplateBuild
	if err := c.do(ctx, r, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// GetBuild returns a build of a template.
func (c *Client) GetBuild(ctx context.Context, name, id string) (*TemplateBuild, error) {
	if err := checkIDs(name, id); err != nil {
		return nil, err
	}
	var b TemplateBuild
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/templates/" + seg(name) + "/builds/" + seg(id), retry: true}, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// errNoEnd is returned when a build log stream ends before its end event.
var errNoEnd = fmt.Errorf("evalbox: the build log ended before the build did: %w", io.ErrUnexpectedEOF)

// FollowBuild writes a build's log to w (nil: discarded) from its start,
// as it is written while the build runs, and returns the build once it
// has ended (succeeded or failed: see its State and Error).
func (c *Client) FollowBuild(ctx context.Context, name, id string, w io.Writer) (*TemplateBuild, error) {
	if err := checkIDs(name, id); err != nil {
		return nil, err
	}
	if w == nil {
		w = io.Discard
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: "/templates/" + seg(name) + "/builds/" + seg(id) + "/logs",
		accept: ContentTypeNDJSON, retry: true})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev BuildEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errNoEnd
			}
			return nil, fmt.Errorf("evalbox: reading the build log: %w", err)
		}
		switch ev.Type {
		case BuildEventLog:
			if _, err := io.WriteString(w, ev.Data); err != nil {
				return nil, err
			}
		case BuildEventEnd:
			if ev.Build == nil {
				return nil, errors.New("evalbox: end event without the build")
			}
			return ev.Build, nil
		}
	}
}
