package e2b

import (
	"compress/gzip"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/evalbox/evalbox/internal/apierr"
	"github.com/evalbox/evalbox/pkg/client"
)

// writeInfo is an entry of POST /files' answer.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 1000

// filePath checks a path the SDK sent: evalbox's files calls take absolute
// paths (the SDKs send them as the caller wrote them).
func filePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", apierr.Errorf(client.CodeBadRequest, "path %q: want an absolute path", p)
	}
	return p, nil
}

// readFiles serves GET /files?path=: the file's bytes.
func (h *Handler) readFiles(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	p, err := filePath(r.URL.Query().Get("path"))
	if err != nil {
		h.writeFileError(w, err)
		return
	}
	fi, rc, err := h.cfg.Sandboxes.OpenFile(r.Context(), c.team, c.id, p)
	if err != nil {
		h.writeFileError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if fi.Type == "file" {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, rc)
}

// writeFiles serves POST /files: a multipart upload of one or more files
// (each part named by its destination path; ?path= names a single one), or
// one file's bytes as application/octet-stream, gzip-encoded or not.
func (h *Handler) writeFiles(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	for k := range r.Header {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "X-Metadata-") {
			h.writeFileError(w, apierr.Errorf(client.CodeNotImplemented, "file metadata (%s) is not supported", k))
			return
		}
	}
	query := r.URL.Query().Get("path")
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		h.writeFileError(w, apierr.Errorf(client.CodeBadRequest, "Content-Type %q: want multipart/form-data or application/octet-stream", r.Header.Get("Content-Type")))
		return
	}
	var written []writeInfo
	put := func(p string, body io.Reader) error {
		p, err := filePath(p)
		if err != nil {
			return err
		}
		fi, err := h.cfg.Sandboxes.WriteFile(r.Context(), c.team, c.id, p, "", body)
		if err != nil {
			return err
		}
		written = append(written, writeInfo{Name: path.Base(fi.Path), Type: "file", Path: fi.Path})
		return nil
	}
	switch {
	case mt == "application/octet-stream":
		var body io.Reader = r.Body
		switch enc := r.Header.Get("Content-Encoding"); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				h.writeFileError(w, apierr.Errorf(client.CodeBadRequest, "gzip body: %v", err))
				return
			}
			defer zr.Close()
			body = zr
		default:
			h.writeFileError(w, apierr.Errorf(client.CodeBadRequest, "Content-Encoding %q: want gzip or none", enc))
			return
		}
		err = put(query, body)
	case mt == "multipart/form-data" && params["boundary"] != "":
		mr := multipart.NewReader(r.Body, params["boundary"])
		parts := 0
		for {
			part, perr := mr.NextPart()
			if errors.Is(perr, io.EOF) {
				break
			}
			if perr != nil {
				err = apierr.Errorf(client.CodeBadRequest, "multipart body: %v", perr)
				break
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			if parts++; parts > maxUploadParts {
				err = apierr.Errorf(client.CodeBadRequest, "more than %d files in one upload", maxUploadParts)
				break
			}
			// The destination path, whole (Part.FileName keeps only
			// its base).
			dest := ""
			if _, dp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition")); err == nil {
				dest = dp["filename"]
			}
			if query != "" {
				if parts > 1 {
					err = apierr.Errorf(client.CodeBadRequest, "?path= names one file; the upload has several (name each part)")
					break
				}
				dest = query
			}
			err = put(dest, part)
			part.Close()
			if err != nil {
				break
			}
		}
		if err == nil && parts == 0 {
			err = apierr.Errorf(client.CodeBadRequest, `multipart body has no "file" part`)
		}
	default:
		err = apierr.Errorf(client.CodeBadRequest, "Content-Type %q: want multipart/form-data or application/octet-stream", mt)
	}
	if err != nil {
		h.writeFileError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, written)
}

// writeFileError answers an error of /files as envd does:
// {"code": status, "message"}.
func (h *Handler) writeFileError(w http.ResponseWriter, err error) {
	status, msg, _ := describe(err)
	if status >= 500 && !errors.As(err, new(*apierr.Error)) {
		h.log.Error("e2b: files", "err", err)
	}
	w.Header().Set(client.HeaderError, apierr.Code(err))
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}
