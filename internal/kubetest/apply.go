package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// FieldManager is the field manager of what ApplyFile applies.
const FieldManager = "kubetest"

// ApplyOptions are ApplyFile's options.
type ApplyOptions struct {
	// DryRun has the server validate and admit every object, and store
	// none: a check of manifests as the cluster would take them.
	DryRun bool
	// FieldValidation is what the server does with a field the schema
	// does not know or one given twice: metav1.FieldValidationStrict
	// (the request fails), Warn or Ignore. Empty means Strict, which is
	// what kubectl does: a manifest with a misspelt field would
	// otherwise apply without it, and a test of that manifest pass.
	FieldValidation string
}

// ApplyFile applies every object of the YAML file at path (documents apart
// by ---), in order, by server-side apply as the admin, and returns them as
// the server answered; any failure fails the test. Applying the repo's
// manifests themselves, rather than objects a test builds to match them,
// makes what deploy/ ships the thing tested. Namespaced objects without a
// namespace go to "default".
func (e *Env) ApplyFile(t testing.TB, path string, opts ApplyOptions) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	out, err := e.Apply(context.Background(), path, b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Apply applies every object of a YAML stream (a JSON document is YAML too)
// as ApplyFile does,
// and returns the first failure instead of failing a test, for tests of
// what the server refuses. name names the stream in errors. Each document
// is sent as it is written, so the server sees what a file holds (a field
// given twice included), not what a decoder kept of it.
func (e *Env) Apply(ctx context.Context, name string, data []byte, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	docs, err := readDocuments(name, data)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	force := true
	po := metav1.PatchOptions{FieldManager: FieldManager, Force: &force, FieldValidation: opts.FieldValidation}
	if po.FieldValidation == "" {
		po.FieldValidation = metav1.FieldValidationStrict
	}
	if opts.DryRun {
		po.DryRun = []string{metav1.DryRunAll}
	}
	var out []*unstructured.Unstructured
	for _, d := range docs {
		obj := d.obj
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			// A kind an earlier object of the file defined (a CRD).
			mapper.Reset()
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			return out, fmt.Errorf("kubetest: %s: %s %s: %w", name, gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(mapping.Resource).Namespace(ns)
		}
		applied, err := ri.Patch(ctx, obj.GetName(), types.ApplyYAMLPatchType, d.raw, po)
		if err != nil {
			return out, fmt.Errorf("kubetest: %s: applying %s %s: %w", name, gvk.Kind, obj.GetName(), err)
		}
		out = append(out, applied)
	}
	return out, nil
}

// document is one object of a stream: as written, and as decoded (for its
// kind, name and namespace).
type document struct {
	raw []byte
	obj *unstructured.Unstructured
}

// readDocuments splits a YAML stream into its objects, skipping empty
// documents.
func readDocuments(name string, data []byte) ([]document, error) {
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []document
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("kubetest: %s: %w", name, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("kubetest: %s: %w", name, err)
		}
		if len(m) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetKind() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("kubetest: %s: an object without kind or name", name)
		}
		docs = append(docs, document{raw: raw, obj: obj})
	}
}
