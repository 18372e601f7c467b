package oci

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// An OCI image layout (index.json, blobs/<algorithm>/<hex>) is read here
// rather than by go-containerregistry's layout package, which opens files
// by path on the host (following symlinks, blocking on FIFOs) and reads
// index.json whole: every read goes through a source, metadata is bounded
// (maxMetadataBytes) and checked against its digest and size.

// blobName is where a layout keeps the blob h.
func blobName(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// readBlob reads a metadata blob whole and checks it against d.
func readBlob(src source, d v1.Descriptor) ([]byte, error) {
	if d.Size < 0 || d.Size > maxMetadataBytes {
		return nil, invalid("%s is %d bytes, over the maximum of %d for image metadata", d.Digest, d.Size, maxMetadataBytes)
	}
	b, err := readAll(src, blobName(d.Digest), maxMetadataBytes)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != d.Size {
		return nil, invalid("%s is %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
	}
	h, err := v1.Hasher(d.Digest.Algorithm)
	if err != nil {
		return nil, invalid("%s: %w", d.Digest, err)
	}
	h.Write(b)
	if got := fmt.Sprintf("%x", h.Sum(nil)); got != d.Digest.Hex {
		return nil, invalid("%s does not match its digest (corrupt layout)", d.Digest)
	}
	return b, nil
}

// openLayoutSource opens the image chosen by ref in the layout of src.
func openLayoutSource(src source, ref string) (v1.Image, error) {
	if !src.has("index.json") {
		return nil, invalid("no index.json: not an OCI image layout")
	}
	b, err := readAll(src, "index.json", maxMetadataBytes)
	if err != nil {
		return nil, err
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, invalid("OCI layout index.json: %w", err)
	}
	candidates := im.Manifests
	if ref != "" {
		candidates = nil
		for _, d := range im.Manifests {
			if d.Annotations[annotationRefName] == ref || d.Annotations[annotationContainerd] == ref || d.Digest.String() == ref {
				candidates = append(candidates, d)
			}
		}
		if len(candidates) == 0 {
			return nil, fmt.Errorf("%w: %q is not in the layout (refs: %s)", ErrUnknownRef, ref, layoutRefs(im))
		}
	} else if len(candidates) != 1 {
		return nil, fmt.Errorf("%w: the layout holds %d manifests (refs: %s); choose one with a ref", ErrUnknownRef, len(candidates), layoutRefs(im))
	}
	d := candidates[0]
	if len(candidates) > 1 {
		// Several manifests under one name: platform variants.
		if d, err = pickPlatform(candidates); err != nil {
			return nil, err
		}
	}
	return resolveLayout(src, d, 0)
}

func layoutRefs(im *v1.IndexManifest) string {
	var refs []string
	for _, d := range im.Manifests {
		if r := d.Annotations[annotationRefName]; r != "" {
			refs = append(refs, r)
		} else {
			refs = append(refs, d.Digest.String())
		}
	}
	if len(refs) == 0 {
		return "none"
	}
	return strings.Join(refs, ", ")
}

// resolveLayout follows d (an image, or an index to take the host
// platform's image from) to an image whose manifest is present.
func resolveLayout(src source, d v1.Descriptor, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, invalid("indexes nested too deep")
	}
	switch d.MediaType {
	case types.OCIImageIndex, types.DockerManifestList:
		b, err := readBlob(src, d)
		if err != nil {
			return nil, missing(d, err)
		}
		im, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return nil, invalid("index %s: %w", d.Digest, err)
		}
		cd, err := pickPlatform(im.Manifests)
		if err != nil {
			return nil, err
		}
		return resolveLayout(src, cd, depth+1)
	case types.OCIManifestSchema1, types.DockerManifestSchema2:
		b, err := readBlob(src, d)
		if err != nil {
			return nil, missing(d, err)
		}
		m, err := v1.ParseManifest(bytes.NewReader(b))
		if err != nil {
			return nil, invalid("manifest %s: %w", d.Digest, err)
		}
		return partial.CompressedToImage(&layoutImage{src: src, desc: d, raw: b, manifest: m})
	default:
		return nil, invalid("manifest %s has unsupported media type %q", d.Digest, d.MediaType)
	}
}

func missing(d v1.Descriptor, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return invalid("manifest %s is missing from the layout (blobs/%s/%s)", d.Digest, d.Digest.Algorithm, d.Digest.Hex)
	}
	if errors.Is(err, ErrInvalidImage) {
		return err
	}
	return invalid("manifest %s: %w", d.Digest, err)
}

// layoutImage is an image of a layout (partial.CompressedImageCore).
type layoutImage struct {
	src      source
	desc     v1.Descriptor
	raw      []byte
	manifest *v1.Manifest
}

func (li *layoutImage) RawManifest() ([]byte, error) { return li.raw, nil }

func (li *layoutImage) MediaType() (types.MediaType, error) {
	if li.manifest.MediaType != "" {
		return li.manifest.MediaType, nil
	}
	return li.desc.MediaType, nil
}

func (li *layoutImage) RawConfigFile() ([]byte, error) {
	return readBlob(li.src, li.manifest.Config)
}

func (li *layoutImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == li.manifest.Config.Digest {
		return &layoutBlob{src: li.src, desc: li.manifest.Config}, nil
	}
	for _, d := range li.manifest.Layers {
		if h == d.Digest {
			return &layoutBlob{src: li.src, desc: d}, nil
		}
	}
	return nil, invalid("layer %s is not in the manifest", h)
}

// layoutBlob is a layer of a layout (partial.CompressedLayer). Its content
// is checked by the applier against the config's diff id.
type layoutBlob struct {
	src  source
	desc v1.Descriptor
}

func (b *layoutBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b *layoutBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b *layoutBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }
func (b *layoutBlob) Descriptor() (*v1.Descriptor, error) { return &b.desc, nil }
func (b *layoutBlob) Compressed() (io.ReadCloser, error) {
	rc, _, err := b.src.open(blobName(b.desc.Digest))
	return rc, err
}
