package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/evalbox/evalbox/internal/outbuf"
	"github.com/evalbox/evalbox/pkg/client"
)

func TestCompleteUTF8(t *testing.T) {
	euro := []byte("€") // 3 bytes
	for _, tc := range []struct {
		in   []byte
		want int
	}{
		{[]byte("abc"), 3},
		{append([]byte("a"), euro[:1]...), 1},
		{append([]byte("a"), euro[:2]...), 1},
		{append([]byte("a"), euro...), 4},
		{[]byte{0xff, 0xfe}, 2}, // invalid bytes are not held back
		{nil, 0},
	} {
		if got := completeUTF8(tc.in); got != tc.want {
			t.Errorf("completeUTF8(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestStreamKeepsCharactersWhole cuts multi-byte characters across chunks
// and checks that the events carry them whole.
func TestStreamKeepsCharactersWhole(t *testing.T) {
	text := strings.Repeat("héllo wörld €✓ ", 50)
	rec := httptest.NewRecorder()
	stream(rec, func(stdout, _ io.Writer) (client.ExecResult, error) {
		b := []byte(text)
		for i := 0; i < len(b); i += 7 {
			if _, err := stdout.Write(b[i:min(i+7, len(b))]); err != nil {
				return client.ExecResult{}, err
			}
		}
		return client.ExecResult{Status: client.StatusExited}, nil
	})
	var got strings.Builder
	var last client.ExecEvent
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	for dec.More() {
		if err := dec.Decode(&last); err != nil {
			t.Fatal(err)
		}
		if last.Type == client.EventStdout {
			if strings.ContainsRune(last.Data, '\uFFFD') {
				t.Fatalf("a character was cut: %q", last.Data)
			}
			got.WriteString(last.Data)
		}
	}
	if got.String() != text || last.Type != client.EventExit {
		t.Fatalf("got %q, last event %+v", got.String(), last)
	}
}

// TestWriteResult: a result written from buffers is the bytes encoding/json
// writes for it with the output as strings.
func TestWriteResult(t *testing.T) {
	for _, res := range []client.ExecResult{
		{ExitCode: 3, Status: client.StatusExited, DurationMs: 12, StdoutTruncated: true},
		{ExitCode: -1, Status: client.StatusKilled, Signal: 9, Error: "out <of> memory & more"},
	} {
		stdout, _ := outbuf.New(nil, outbuf.Fail)
		stderr, _ := outbuf.New(nil, outbuf.Fail)
		_, _ = stdout.Write([]byte("hello\x00\n\"é\xff"))
		_, _ = stderr.Write([]byte("<warn>\u2028"))
		var got bytes.Buffer
		if err := writeResult(&got, res, stdout, stderr); err != nil {
			t.Fatal(err)
		}
		res.Stdout, res.Stderr = stdout.String(), stderr.String()
		want, _ := json.Marshal(res)
		if got.String() != string(want) {
			t.Errorf("got  %s\nwant %s", got.Bytes(), want)
		}
	}
}
