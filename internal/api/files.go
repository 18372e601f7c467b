package api

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/evalbox/evalbox/internal/auth"
	"github.com/evalbox/evalbox/pkg/client"
)

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	max := s.svc.MaxFileBytes()
	if r.ContentLength > max {
		writeError(w, errorf(client.CodePayloadTooLarge, "file is %d bytes, the maximum is %d", r.ContentLength, max))
		return
	}
	q := r.URL.Query()
	// The agent enforces the maximum too (for chunked bodies), and writes
	// atomically: a cut or oversize upload leaves no file.
	// MaxBytesReader makes the server answer 413 and close the connection
	// cleanly when a chunked body runs past the maximum.
	body := http.MaxBytesReader(w, r.Body, max)
	fi, err := s.svc.WriteFile(r.Context(), p.TeamID, r.PathValue("id"), q.Get("path"), q.Get("mode"), body)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		err = errorf(client.CodePayloadTooLarge, "file is over the maximum of %d bytes", max)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, fi)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	fi, rc, err := s.svc.OpenFile(r.Context(), p.TeamID, r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if fi.Type == client.FileTypeFile && fi.Size > 0 {
		// Files of procfs or devices may yield more than stat says.
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil && !errors.Is(err, r.Context().Err()) {
		// Headers are gone: the short body tells the client.
		s.log.Warn("download cut", "sandbox", r.PathValue("id"), "err", err)
	}
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	fi, err := s.svc.StatFile(r.Context(), p.TeamID, r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	fs, err := s.svc.ListFiles(r.Context(), p.TeamID, r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, client.FileList{Files: fs})
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.MkdirRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	fi, err := s.svc.Mkdir(r.Context(), p.TeamID, r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, fi)
}

func (s *Server) renameFile(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req client.RenameRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	fi, err := s.svc.RenameFile(r.Context(), p.TeamID, r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	recursive := false
	if v := q.Get("recursive"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, errorf(client.CodeBadRequest, "recursive must be true or false, got %q", v))
			return
		}
		recursive = b
	}
	if err := s.svc.RemoveFile(r.Context(), p.TeamID, r.PathValue("id"), q.Get("path"), recursive); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
