package apierr

import (
	"errors"
	"fmt"
	"testing"
)

func TestCodeThroughWrapping(t *testing.T) {
	err := fmt.Errorf("exec: %w", &Error{Code: "not_found", Message: "no sandbox x", Err: ErrStoppedDuringCall})
	if Code(err) != "not_found" || !errors.Is(err, ErrStoppedDuringCall) {
		t.Fatalf("code %q, is stopped %v", Code(err), errors.Is(err, ErrStoppedDuringCall))
	}
	if Code(errors.New("plain")) != "" {
		t.Error("a plain error has a code")
	}
	if e := Errorf("bad_request", "n=%d", 3); e.Error() != "bad_request: n=3" {
		t.Errorf("%q", e.Error())
	}
}
