package kubetest

import (
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
}

// ApplyFile applies every object of the YAML file at path (documents apart
// by ---), in order, by server-side apply as the admin, and returns them as
// the server answered. Applying the repo's manifests themselves, rather than
// objects a test builds to match them, makes what deploy/ ships the thing
// tested. Namespaced objects without a namespace go to "default".
func (e *Env) ApplyFile(t testing.TB, path string, opts ApplyOptions) []*unstructured.Unstructured {
	t.Helper()
	objs, err := readObjects(path)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ao := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	if opts.DryRun {
		ao.DryRun = []string{metav1.DryRunAll}
	}
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			// A kind an earlier object of the file defined (a CRD).
			mapper.Reset()
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			t.Fatalf("kubetest: %s: %s %s: %v", path, gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(mapping.Resource).Namespace(ns)
		}
		applied, err := ri.Apply(ctx, obj.GetName(), obj, ao)
		if err != nil {
			t.Fatalf("kubetest: %s: applying %s %s: %v", path, gvk.Kind, obj.GetName(), err)
		}
		out = append(out, applied)
	}
	return out
}

// readObjects decodes the objects of a YAML (or JSON) file, skipping empty
// documents.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("kubetest: %s: %w", path, err)
		}
		if len(m) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetKind() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("kubetest: %s: an object without kind or name", path)
		}
		objs = append(objs, obj)
	}
}
