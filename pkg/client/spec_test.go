package client

import (
	"encoding/json"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// specPath is api/openapi.yaml, relative to this package.
var specPath = filepath.Join("..", "..", "api", "openapi.yaml")

// wireTypes maps every schema of the spec to its Go type. Every struct
// declared in types.go must be here (TestSpecSchemasMatchTypes checks it).
var wireTypes = map[string]reflect.Type{
	"ErrorBody":            reflect.TypeFor[ErrorBody](),
	"ErrorDetail":          reflect.TypeFor[ErrorDetail](),
	"CreateSandboxRequest": reflect.TypeFor[CreateSandboxRequest](),
	"Sandbox":              reflect.TypeFor[Sandbox](),
	"SandboxList":          reflect.TypeFor[SandboxList](),
	"Snapshot":             reflect.TypeFor[Snapshot](),
	"SnapshotList":         reflect.TypeFor[SnapshotList](),
	"ForkRequest":          reflect.TypeFor[ForkRequest](),
	"ForkResult":           reflect.TypeFor[ForkResult](),
	"ResumeRequest":        reflect.TypeFor[ResumeRequest](),
	"DeleteResult":         reflect.TypeFor[DeleteResult](),
	"SetTimeoutRequest":    reflect.TypeFor[SetTimeoutRequest](),
	"ExecRequest":          reflect.TypeFor[ExecRequest](),
	"ExecResult":           reflect.TypeFor[ExecResult](),
	"ExecEvent":            reflect.TypeFor[ExecEvent](),
	"Process":              reflect.TypeFor[Process](),
	"ProcessList":          reflect.TypeFor[ProcessList](),
	"SignalRequest":        reflect.TypeFor[SignalRequest](),
	"FileInfo":             reflect.TypeFor[FileInfo](),
	"FileList":             reflect.TypeFor[FileList](),
	"MkdirRequest":         reflect.TypeFor[MkdirRequest](),
	"RenameRequest":        reflect.TypeFor[RenameRequest](),
	"Team":                 reflect.TypeFor[Team](),
	"Limits":               reflect.TypeFor[Limits](),
	"TeamUsage":            reflect.TypeFor[TeamUsage](),
	"CreateTeamRequest":    reflect.TypeFor[CreateTeamRequest](),
	"TeamList":             reflect.TypeFor[TeamList](),
	"UpdateTeamRequest":    reflect.TypeFor[UpdateTeamRequest](),
	"APIKey":               reflect.TypeFor[APIKey](),
	"CreateKeyRequest":     reflect.TypeFor[CreateKeyRequest](),
	"KeyList":              reflect.TypeFor[KeyList](),
	"TeamSecret":           reflect.TypeFor[TeamSecret](),
	"Tariff":               reflect.TypeFor[Tariff](),
	"TariffList":           reflect.TypeFor[TariffList](),
	"PutTariffRequest":     reflect.TypeFor[PutTariffRequest](),
	"UsageReport":          reflect.TypeFor[UsageReport](),
	"UsageLine":            reflect.TypeFor[UsageLine](),
	"Balance":              reflect.TypeFor[Balance](),
	"TopUpRequest":         reflect.TypeFor[TopUpRequest](),
	"LedgerEntry":          reflect.TypeFor[LedgerEntry](),
	"LedgerList":           reflect.TypeFor[LedgerList](),
	"TeamSecretList":       reflect.TypeFor[TeamSecretList](),
	"PutSecretRequest":     reflect.TypeFor[PutSecretRequest](),
	"Template":             reflect.TypeFor[Template](),
	"TemplateList":         reflect.TypeFor[TemplateList](),
	"TemplateSpec":         reflect.TypeFor[TemplateSpec](),
	"TemplateStep":         reflect.TypeFor[TemplateStep](),
	"CopyStep":             reflect.TypeFor[CopyStep](),
	"BuildTemplateRequest": reflect.TypeFor[BuildTemplateRequest](),
	"TemplateBuild":        reflect.TypeFor[TemplateBuild](),
	"TemplateTag":          reflect.TypeFor[TemplateTag](),
	"WatchEvent":           reflect.TypeFor[WatchEvent](),
	"TemplateTagList":      reflect.TypeFor[TemplateTagList](),
	"TagTemplateRequest":   reflect.TypeFor[TagTemplateRequest](),
	"BuildEvent":           reflect.TypeFor[BuildEvent](),
	"Pool":                 reflect.TypeFor[Pool](),
	"PoolList":             reflect.TypeFor[PoolList](),
	"Health":               reflect.TypeFor[Health](),
	"Capacity":             reflect.TypeFor[Capacity](),
	"CapacityAmount":       reflect.TypeFor[CapacityAmount](),
	"ExecuteRequest":       reflect.TypeFor[ExecuteRequest](),
	"ExecuteResponse":      reflect.TypeFor[ExecuteResponse](),
	"EvalProblem":          reflect.TypeFor[EvalProblem](),
	"EvalIOCase":           reflect.TypeFor[EvalIOCase](),
	"EvalTest":             reflect.TypeFor[EvalTest](),
	"EvalChecker":          reflect.TypeFor[EvalChecker](),
	"EvalCompile":          reflect.TypeFor[EvalCompile](),
	"EvalTestResult":       reflect.TypeFor[EvalTestResult](),
	"EvalSample":           reflect.TypeFor[EvalSample](),
	"CreateEvalRequest":    reflect.TypeFor[CreateEvalRequest](),
	"EvalRun":              reflect.TypeFor[EvalRun](),
	"EvalSummary":          reflect.TypeFor[EvalSummary](),
	"PhaseStats":           reflect.TypeFor[PhaseStats](),
	"EvalRunList":          reflect.TypeFor[EvalRunList](),
	"EvalResult":           reflect.TypeFor[EvalResult](),
	"EvalEvent":            reflect.TypeFor[EvalEvent](),
	"NetworkSpec":          reflect.TypeFor[NetworkSpec](),
	"NetworkRuleLists":     reflect.TypeFor[NetworkRuleLists](),
	"PortSpec":             reflect.TypeFor[PortSpec](),
	"SetPortsRequest":      reflect.TypeFor[SetPortsRequest](),
	"TrafficToken":         reflect.TypeFor[TrafficToken](),
	"AuditEvent":           reflect.TypeFor[AuditEvent](),
	"AuditList":            reflect.TypeFor[AuditList](),
}

// enumConsts maps "Schema.property" to the prefix of the constants in
// types.go that list its values, or, after "=", the names of the constants
// of a field that takes some of them only.
var enumConsts = map[string]string{
	"ErrorDetail.code":             "Code",
	"WatchEvent.type":              "Watch",
	"CreateSandboxRequest.runtime": "Runtime",
	"CreateSandboxRequest.network": "Network",
	"Sandbox.runtime":              "Runtime",
	"Sandbox.network":              "Network",
	"Sandbox.state":                "State",
	"Snapshot.runtime":             "Runtime",
	"Snapshot.network":             "Network",
	"ExecResult.status":            "Status",
	"ExecEvent.type":               "Event",
	"FileInfo.type":                "FileType",
	"Template.source":              "TemplateSource",
	"TemplateSpec.network":         "=NetworkNone,NetworkOutbound",
	"TemplateBuild.kind":           "BuildKind",
	"TemplateBuild.state":          "BuildState",
	"BuildEvent.type":              "BuildEvent",
	"ExecuteRequest.language":      "Language",
	"EvalRun.state":                "EvalState",
	"EvalRun.mode":                 "EvalMode",
	"CreateEvalRequest.mode":       "EvalMode",
	"EvalEvent.type":               "EvalEvent",
	"EvalChecker.type":             "Checker",
	"EvalTestResult.status":        "Test",
	"Pool.runtime":                 "Runtime",
	"Pool.network":                 "=NetworkNone,NetworkOutbound",
	"NetworkSpec.mode":             "Network",
	"AuditEvent.action":            "AuditAction",
	"LedgerEntry.kind":             "Ledger",
	"TopUpRequest.kind":            "=LedgerTopUp,LedgerAdjust",
}

type yamlMap = map[string]any

func loadSpec(t testing.TB) yamlMap {
	t.Helper()
	b, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yamlMap
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("parsing %s: %v", specPath, err)
	}
	return doc
}

// dig walks doc along keys; nil when a key is missing.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(yamlMap)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func asMap(v any) yamlMap {
	m, _ := v.(yamlMap)
	return m
}

// resolve follows a local $ref ("#/components/…") once.
func resolve(doc yamlMap, v any) yamlMap {
	m := asMap(v)
	if ref, ok := m["$ref"].(string); ok {
		return asMap(dig(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...))
	}
	return m
}

func TestSpecSchemasMatchTypes(t *testing.T) {
	doc := loadSpec(t)
	schemas := asMap(dig(doc, "components", "schemas"))
	if len(schemas) == 0 {
		t.Fatal("no components.schemas in the spec")
	}
	structs, consts := parseTypesGo(t)

	for _, name := range structs {
		if _, ok := wireTypes[name]; !ok {
			t.Errorf("types.go declares struct %s but wireTypes (spec_test.go) does not map it to a schema", name)
		}
	}
	for name := range wireTypes {
		if !slices.Contains(structs, name) {
			t.Errorf("wireTypes lists %s, which types.go does not declare", name)
		}
		if _, ok := schemas[name]; !ok {
			t.Errorf("schema %s missing from the spec", name)
		}
	}
	for name, s := range schemas {
		typ, ok := wireTypes[name]
		if !ok {
			t.Errorf("spec schema %s has no Go type in types.go", name)
			continue
		}
		checkStruct(t, name, asMap(s), typ, consts)
	}
}

// checkStruct compares a schema with a struct: same properties as json
// tags, required = the fields without omitempty, compatible types, enums
// equal to the constants of types.go.
func checkStruct(t *testing.T, name string, schema yamlMap, typ reflect.Type, consts map[string]string) {
	t.Helper()
	if schema["type"] != "object" {
		t.Errorf("%s: type is %v, want object", name, schema["type"])
	}
	props := asMap(schema["properties"])
	var wantRequired []string
	seen := map[string]bool{}
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		jname, opts, _ := strings.Cut(tag, ",")
		if jname == "-" || !f.IsExported() {
			continue
		}
		if jname == "" {
			jname = f.Name
		}
		seen[jname] = true
		where := name + "." + jname
		p, ok := props[jname]
		if !ok {
			t.Errorf("%s: Go field %s has no property in the spec", where, f.Name)
			continue
		}
		if o := strings.Split(opts, ","); !slices.Contains(o, "omitempty") && !slices.Contains(o, "omitzero") {
			wantRequired = append(wantRequired, jname)
		}
		ps := asMap(p)
		if alts, ok := ps["oneOf"].([]any); ok {
			// A struct that is also written as a string (its mode): the
			// string's enum is the field's, the object its schema.
			ps = nil
			for _, a := range alts {
				if am := asMap(a); am["$ref"] != nil {
					checkType(t, where, am, f.Type)
				} else if am["type"] == "string" {
					ps = am
				}
			}
			if ps == nil {
				t.Errorf("%s: oneOf without a string form", where)
				continue
			}
		} else {
			checkType(t, where, ps, f.Type)
		}
		if prefix, ok := enumConsts[where]; ok {
			var want []string
			if names, ok := strings.CutPrefix(prefix, "="); ok {
				for _, n := range strings.Split(names, ",") {
					want = append(want, consts[n])
				}
			}
			for cname, v := range consts {
				if !strings.HasPrefix(prefix, "=") && strings.HasPrefix(cname, prefix) && len(cname) > len(prefix) &&
					cname[len(prefix)] >= 'A' && cname[len(prefix)] <= 'Z' {
					want = append(want, v)
				}
			}
			got := stringList(ps["enum"])
			sort.Strings(want)
			sort.Strings(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s: enum %v, but types.go's %s* constants are %v", where, got, prefix, want)
			}
		} else if _, ok := ps["enum"]; ok {
			t.Errorf("%s: enum in the spec without constants in types.go (add them and to enumConsts)", where)
		}
	}
	for p := range props {
		if !seen[p] {
			t.Errorf("%s.%s: spec property has no field in the Go type", name, p)
		}
	}
	gotRequired := stringList(schema["required"])
	sort.Strings(gotRequired)
	sort.Strings(wantRequired)
	if !slices.Equal(gotRequired, wantRequired) {
		t.Errorf("%s: required %v, want the fields without omitempty %v", name, gotRequired, wantRequired)
	}
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

func checkType(t *testing.T, where string, s yamlMap, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if typ == rawType {
		// Any JSON value: the schema names no type.
		if _, ok := s["type"]; ok {
			t.Errorf("%s: json.RawMessage is any JSON value, but the spec says type %v", where, s["type"])
		}
		return
	}
	if ref, ok := s["$ref"].(string); ok {
		want := "#/components/schemas/" + typ.Name()
		if typ.Kind() != reflect.Struct || typ == timeType || ref != want {
			t.Errorf("%s: $ref %s for Go type %s", where, ref, typ)
		}
		return
	}
	st, _ := s["type"].(string)
	want := ""
	switch typ.Kind() {
	case reflect.String:
		want = "string"
	case reflect.Int, reflect.Int64, reflect.Int32:
		want = "integer"
		if typ.Kind() == reflect.Int64 && s["format"] != "int64" {
			t.Errorf("%s: int64 field needs format: int64", where)
		}
	case reflect.Float64, reflect.Float32:
		want = "number"
	case reflect.Bool:
		want = "boolean"
	case reflect.Struct:
		if typ != timeType {
			t.Errorf("%s: struct %s must be a $ref to its schema", where, typ)
			return
		}
		want = "string"
		if s["format"] != "date-time" {
			t.Errorf("%s: time.Time needs format: date-time", where)
		}
	case reflect.Slice:
		want = "array"
		if st == want {
			checkType(t, where+"[]", asMap(s["items"]), typ.Elem())
		}
	case reflect.Map:
		want = "object"
		if typ.Key().Kind() != reflect.String {
			t.Errorf("%s: map key must be string", where)
		}
		if st == want {
			checkType(t, where+"{}", asMap(s["additionalProperties"]), typ.Elem())
		}
	default:
		t.Errorf("%s: Go kind %s has no spec mapping in this test", where, typ.Kind())
		return
	}
	if st != want {
		t.Errorf("%s: spec type %q, Go type %s wants %q", where, st, typ, want)
	}
}

func stringList(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// parseTypesGo returns the struct types and the string constants declared
// in types.go.
func parseTypesGo(t *testing.T) (structs []string, consts map[string]string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts = map[string]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, sp := range gd.Specs {
			switch sp := sp.(type) {
			case *ast.TypeSpec:
				if _, ok := sp.Type.(*ast.StructType); ok {
					structs = append(structs, sp.Name.Name)
				}
			case *ast.ValueSpec:
				if gd.Tok != token.CONST {
					continue
				}
				for i, n := range sp.Names {
					if i >= len(sp.Values) {
						continue
					}
					if lit, ok := sp.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						consts[n.Name] = constant.StringVal(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
					}
				}
			}
		}
	}
	return structs, consts
}

func TestSpecStructure(t *testing.T) {
	doc := loadSpec(t)
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Errorf("openapi: %q, want 3.1.x", v)
	}
	if dig(doc, "components", "securitySchemes", "bearerAuth", "scheme") != "bearer" {
		t.Error("components.securitySchemes.bearerAuth must be an http bearer scheme")
	}
	// Every local $ref resolves.
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case yamlMap:
			if ref, ok := v["$ref"].(string); ok {
				if !strings.HasPrefix(ref, "#/") || resolve(doc, v) == nil {
					t.Errorf("%s: $ref %s does not resolve", path, ref)
				}
			}
			for k, x := range v {
				walk(path+"/"+k, x)
			}
		case []any:
			for _, x := range v {
				walk(path, x)
			}
		}
	}
	walk("#", doc)

	ops := map[string]bool{}
	for _, rt := range specRoutes(t, doc) {
		where := rt.method + " " + rt.template
		if ops[rt.opID] {
			t.Errorf("%s: duplicate operationId %s", where, rt.opID)
		}
		ops[rt.opID] = true
		if !strings.HasPrefix(rt.template, "/v1/") && rt.template != "/metrics" { // Prometheus's conventional path
			t.Errorf("%s: path outside /v1", where)
		}
		op := rt.op
		public := op["security"] != nil && len(op["security"].([]any)) == 0
		responses := asMap(op["responses"])
		var has2xx bool
		for code, r := range responses {
			resp := resolve(doc, r)
			if resp == nil {
				t.Errorf("%s %s: unresolved response", where, code)
				continue
			}
			if strings.HasPrefix(code, "2") {
				has2xx = true
				continue
			}
			if dig(resp, "content", "application/json", "schema", "$ref") != "#/components/schemas/ErrorBody" {
				t.Errorf("%s %s: error response must be an ErrorBody", where, code)
			}
			if (code == "429" || code == "503") && dig(resp, "headers", "Retry-After") == nil {
				t.Errorf("%s %s: needs a Retry-After header", where, code)
			}
		}
		if !has2xx {
			t.Errorf("%s: no success response", where)
		}
		if !public && responses["401"] == nil {
			t.Errorf("%s: authenticated operation without 401", where)
		}
		// Request rate limits apply to every authenticated request but a
		// port URL's (internal/api/ratelimit.go).
		if !public && responses["429"] == nil && !strings.Contains(rt.template, "/ports/{port}") {
			t.Errorf("%s: authenticated operation without 429 (rate_limited)", where)
		}
		if responses["500"] == nil {
			t.Errorf("%s: no 500 response", where)
		}
		// Every {param} of the path is declared.
		declared := map[string]bool{}
		for _, p := range append(rt.params, asMap(op)["parameters"].([]any)...) {
			if pm := resolve(doc, p); pm["in"] == "path" {
				declared[pm["name"].(string)] = true
			}
		}
		for _, s := range strings.Split(rt.template, "/") {
			if strings.HasPrefix(s, "{") && !declared[strings.Trim(s, "{}")] {
				t.Errorf("%s: path parameter %s not declared", where, s)
			}
		}
	}
	if len(ops) < 29 {
		t.Errorf("only %d operations in the spec", len(ops))
	}
}

// route is one operation of the spec.
type route struct {
	method   string
	template string
	segs     []string
	opID     string
	op       yamlMap
	params   []any // path-level parameters
}

func specRoutes(t testing.TB, doc yamlMap) []route {
	t.Helper()
	var out []route
	for tmpl, item := range asMap(doc["paths"]) {
		im := asMap(item)
		params, _ := im["parameters"].([]any)
		for m, op := range im {
			method := strings.ToUpper(m)
			switch method {
			case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			default:
				continue
			}
			om := asMap(op)
			if _, ok := om["parameters"]; !ok {
				om["parameters"] = []any{}
			}
			id, _ := om["operationId"].(string)
			if id == "" {
				t.Errorf("%s %s: no operationId", method, tmpl)
			}
			out = append(out, route{method: method, template: tmpl, segs: strings.Split(tmpl, "/"), opID: id, op: om, params: params})
		}
	}
	return out
}

// match returns the route a request hits, comparing escaped path segments.
func match(routes []route, method, escapedPath string) (route, bool) {
	segs := strings.Split(escapedPath, "/")
	var best route
	found := false
	for _, rt := range routes {
		if rt.method != method || len(rt.segs) != len(segs) {
			continue
		}
		ok, literal := true, 0
		for i, s := range rt.segs {
			if strings.HasPrefix(s, "{") {
				if segs[i] == "" {
					ok = false
				}
				continue
			}
			if s != segs[i] {
				ok = false
				break
			}
			literal++
		}
		// Prefer the most literal match (/files/stat over /files/{x}).
		if ok && (!found || literal > countLiteral(best)) {
			best, found = rt, true
		}
	}
	return best, found
}

func countLiteral(rt route) int {
	n := 0
	for _, s := range rt.segs {
		if !strings.HasPrefix(s, "{") {
			n++
		}
	}
	return n
}
