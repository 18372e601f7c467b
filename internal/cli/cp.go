package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/evalbox/evalbox/pkg/client"
	"github.com/spf13/cobra"
)

func newSandboxCpCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox",
		Long: `Copy a file into or out of a sandbox. One side is ID:/absolute/path, the
other a local path, or - for stdin/stdout. The content is streamed.

When DST is a directory (or a sandbox path ending in /) the file keeps its
name. An upload keeps the local file's permission bits. Directories are not
copied (copy a tar archive and unpack it with exec).`,
		Example: `  evalbox sandbox cp solution.py sb-1:/work/solution.py
  evalbox sandbox cp sb-1:/work/out.json ./out.json
  tar c src | evalbox sandbox cp - sb-1:/tmp/src.tar`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			srcID, srcPath, srcRemote := splitRemote(argv[0])
			dstID, dstPath, dstRemote := splitRemote(argv[1])
			switch {
			case srcRemote == dstRemote:
				return usagef(cmd, "exactly one of SRC and DST must be ID:/path")
			case dstRemote:
				return upload(cmd, a.client(), argv[0], dstID, dstPath)
			default:
				return download(cmd, a.client(), srcID, srcPath, argv[1])
			}
		},
	}
}

// splitRemote splits "ID:/path". A local path with a colon ("./a:b") is
// not remote: the id part may not hold a slash and the path must be
// absolute.
func splitRemote(s string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") || !strings.HasPrefix(p, "/") {
		return "", "", false
	}
	return id, p, true
}

var errDirCopy = errors.New("copying directories is not supported (copy a tar archive and unpack it with exec)")

func upload(cmd *cobra.Command, c *client.Client, src, id, dst string) error {
	ctx := cmd.Context()
	var (
		r    io.Reader
		size int64 = -1
		mode os.FileMode
		name = filepath.Base(src)
	)
	if src == "-" {
		r, name = cmd.InOrStdin(), ""
	} else {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.IsDir() {
			return errDirCopy
		}
		if st.Mode().IsRegular() {
			size = st.Size()
		}
		r, mode = f, st.Mode().Perm()
	}
	switch {
	case strings.HasSuffix(dst, "/"):
		if name == "" {
			return usagef(cmd, "DST %s is a directory: give a file name when copying stdin", dst)
		}
		dst = path.Join(dst, name)
	case name != "":
		// Copying onto an existing directory keeps the file's name.
		fi, err := c.StatFile(ctx, id, dst)
		if err == nil && fi.Type == client.FileTypeDir {
			dst = path.Join(dst, name)
		} else if err != nil && !client.IsNotFound(err) {
			return err
		}
	}
	_, err := c.WriteFile(ctx, id, dst, r, size, mode)
	return err
}

func download(cmd *cobra.Command, c *client.Client, id, src, dst string) error {
	rc, size, err := c.ReadFile(cmd.Context(), id, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err = io.Copy(out(cmd), rc)
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, rc)
	if err == nil && size >= 0 && n != size {
		err = fmt.Errorf("%s: got %d bytes of %d", src, n, size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// Leave no partial file behind.
		_ = os.Remove(dst)
		return fmt.Errorf("downloading %s:%s: %w", id, src, err)
	}
	return nil
}
