package eval

// Records and their fields: the JSON Lines, JSON array and JSON object
// documents ReadProblemsFormat reads, and typed access to a record's fields.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"strings"
)

// maxDocument bounds a whole JSON document (an array or object of
// records) and a decompressed LiveCodeBench test blob.
const maxDocument = 1 << 30

// record is one problem record of a file.
type record struct {
	raw []byte
	// index is its 0-based place among the file's records; key its key
	// in a JSON object ("" otherwise).
	index int
	key   string
}

// fields decodes the record as a JSON object. Python's json writes NaN
// and Infinity, which are not JSON, and evalplus's inputs hold them: a
// record that reads only with them replaced by placeholders (which
// restoreNonFinite turns back) is read so, and nonFinite says so.
func (rec record) fields() (f fields, nonFinite bool, err error) {
	if k := kind(rec.raw); k != "an object" {
		return nil, false, fmt.Errorf("a record must be a JSON object, got %s", k)
	}
	if err := json.Unmarshal(rec.raw, &f); err != nil {
		var f2 fields
		if json.Unmarshal(sanitizeNonFinite(rec.raw), &f2) == nil {
			return f2, true, nil
		}
		return nil, false, err
	}
	return f, false, nil
}

// fallbackID is the record's id where it has none of its own: its key in
// a JSON object, else its index.
func (rec record) fallbackID() string {
	if rec.key != "" {
		return rec.key
	}
	return strconv.Itoa(rec.index)
}

// eachRecord calls fn for every record of r (see ReadProblemsFormat),
// prefixing its errors with the record's place.
func eachRecord(r io.Reader, fn func(record) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 64<<10)
	}
	first, err := firstByte(br)
	if err != nil {
		return err
	}
	switch first {
	case 0:
		return nil
	case '[':
		return eachInArray(br, fn)
	case '{':
		// JSON Lines, unless the whole input is one object: then an
		// object of records, or one record.
		rec := &recorder{r: limitDocument(br)}
		dec := json.NewDecoder(rec)
		var v json.RawMessage
		if err := dec.Decode(&v); err == nil && !dec.More() {
			if _, err := dec.Token(); err == io.EOF {
				if isObjectOfRecords(v) {
					return eachInObject(v, fn)
				}
				if bytes.Contains(v, []byte{'\n'}) {
					// One record over several lines.
					return fn(record{raw: v})
				}
			}
		}
		index := 0
		return lines(io.MultiReader(bytes.NewReader(rec.buf), br), func(_ int, line []byte) error {
			index++
			return fn(record{raw: line, index: index - 1})
		})
	}
	return fmt.Errorf("want JSON Lines or a JSON array or object of records, got a file starting with %q", first)
}

// firstByte peeks the first byte that is not white space (0 for an empty
// input).
func firstByte(br *bufio.Reader) (byte, error) {
	for {
		c, err := br.ReadByte()
		if err == io.EOF {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c, br.UnreadByte()
	}
}

// limitDocument reads r up to maxDocument bytes, then fails.
func limitDocument(r io.Reader) io.Reader {
	return &docLimit{r: r, left: maxDocument}
}

type docLimit struct {
	r    io.Reader
	left int64
}

func (l *docLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, fmt.Errorf("a JSON document of more than %d bytes (use JSON Lines)", maxDocument)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// recorder keeps what it reads, to read it again.
type recorder struct {
	r   io.Reader
	buf []byte
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf = append(r.buf, p[:n]...)
	return n, err
}

// isObjectOfRecords reports whether v is a non-empty JSON object whose
// every value is an object (a record always has a non-object field).
func isObjectOfRecords(v []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(v, &m) != nil || len(m) == 0 {
		return false
	}
	for _, x := range m {
		if kind(x) != "an object" {
			return false
		}
	}
	return true
}

func eachInArray(br *bufio.Reader, fn func(record) error) error {
	dec := json.NewDecoder(limitDocument(br))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for i := 0; dec.More(); i++ {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		if err := fn(record{raw: v, index: i}); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON array")
	}
	return nil
}

func eachInObject(v []byte, fn func(record) error) error {
	dec := json.NewDecoder(bytes.NewReader(v))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for i := 0; dec.More(); i++ {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("record %q: %w", key, err)
		}
		if err := fn(record{raw: raw, index: i, key: key}); err != nil {
			return fmt.Errorf("record %q: %w", key, err)
		}
	}
	return nil
}

// sanitizeNonFinite replaces the bare NaN, Infinity and -Infinity of
// Python's json (outside strings) by placeholder strings that
// restoreNonFinite turns back.
func sanitizeNonFinite(b []byte) []byte {
	var out bytes.Buffer
	inStr, esc := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inStr {
			out.WriteByte(c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		if c == '"' {
			inStr = true
			out.WriteByte(c)
			continue
		}
		for _, tok := range []string{"-Infinity", "Infinity", "NaN"} {
			if bytes.HasPrefix(b[i:], []byte(tok)) {
				out.WriteString(nonFinitePrefix + tok + `"`)
				i += len(tok) - 1
				goto next
			}
		}
		out.WriteByte(c)
	next:
	}
	return out.Bytes()
}

const nonFinitePrefix = `"\u0000evalbox:`

// restoreNonFinite undoes sanitizeNonFinite in a JSON text meant for
// Python's json.loads, which reads NaN and Infinity.
func restoreNonFinite(b []byte) []byte {
	for _, tok := range []string{"-Infinity", "Infinity", "NaN"} {
		b = bytes.ReplaceAll(b, []byte(nonFinitePrefix+tok+`"`), []byte(tok))
	}
	return b
}

// fields is one record's JSON object; its accessors name the field in
// their errors. An absent field and null read as zero values.
type fields map[string]json.RawMessage

func (f fields) has(k string) bool {
	v, ok := f[k]
	return ok && kind(v) != "null"
}

func (f fields) str(k string) (string, error) {
	if !f.has(k) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(f[k], &s); err != nil {
		return "", fmt.Errorf("%s: want a string, got %s", k, kind(f[k]))
	}
	return s, nil
}

func (f fields) strs(k string) ([]string, error) {
	if !f.has(k) {
		return nil, nil
	}
	var ss []string
	if err := json.Unmarshal(f[k], &ss); err != nil {
		return nil, fmt.Errorf("%s: want a list of strings, got %s", k, kindDeep(f[k]))
	}
	return ss, nil
}

// id reads a task id given as a JSON string or integer.
func (f fields) id(k string) (string, error) {
	if !f.has(k) {
		return "", nil
	}
	v := bytes.TrimSpace(f[k])
	if v[0] == '"' {
		return f.str(k)
	}
	if _, ok := new(big.Int).SetString(string(v), 10); ok {
		return string(v), nil
	}
	return "", fmt.Errorf("%s: want a string or an integer, got %s", k, kind(v))
}

// taskID is the first of keys the record has (a string or an integer),
// else the record's place in its file.
func (f fields) taskID(rec record, keys ...string) (string, error) {
	for _, k := range keys {
		id, err := f.id(k)
		if err != nil {
			return "", err
		}
		if id != "" {
			return id, nil
		}
	}
	return rec.fallbackID(), nil
}

// nested reads a field that holds JSON either as a value or as a JSON
// string of it (APPS's input_output, LiveCodeBench's metadata).
func (f fields) nested(k string) (json.RawMessage, error) {
	if !f.has(k) {
		return nil, nil
	}
	v := bytes.TrimSpace(f[k])
	if v[0] != '"' {
		return v, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", k, err)
	}
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if !json.Valid([]byte(s)) {
		return nil, fmt.Errorf("%s: the string is not JSON text", k)
	}
	return json.RawMessage(s), nil
}

// kind names the JSON type of a value, for an error.
func kind(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// kindDeep is kind, with an array's first element that is not a string.
func kindDeep(v []byte) string {
	var elems []json.RawMessage
	if json.Unmarshal(v, &elems) == nil {
		for i, e := range elems {
			if kind(e) != "a string" {
				return fmt.Sprintf("an array whose element %d is %s", i, kind(e))
			}
		}
	}
	return kind(v)
}

// jsonString is a JSON string as a Go string (after a successful kind
// check); other values are not strings.
func jsonString(v []byte) (string, bool) {
	var s string
	if kind(v) != "a string" || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}
