package client

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestNetworkSpecJSON: a network is written as its mode alone when it has
// no lists (what servers before rules read), and read in either form.
func TestNetworkSpecJSON(t *testing.T) {
	for _, c := range []struct {
		spec NetworkSpec
		wire string
	}{
		{Network(NetworkOutbound), `"outbound"`},
		{NetworkSpec{Mode: NetworkRules}, `{"mode":"rules"}`},
		{NetworkSpec{Mode: NetworkRules, Allow: []string{"pypi.org"}, Deny: []string{"10.0.0.0/8"}}, `{"mode":"rules","allow":["pypi.org"],"deny":["10.0.0.0/8"]}`},
	} {
		b, err := json.Marshal(c.spec)
		if err != nil || string(b) != c.wire {
			t.Errorf("marshal %+v = %s, %v; want %s", c.spec, b, err, c.wire)
		}
		var back NetworkSpec
		if err := json.Unmarshal([]byte(c.wire), &back); err != nil || !reflect.DeepEqual(back, c.spec) {
			t.Errorf("unmarshal %s = %+v, %v", c.wire, back, err)
		}
	}
	// Omitted from a create without one.
	b, _ := json.Marshal(CreateSandboxRequest{Template: "base"})
	if string(b) != `{"template":"base"}` {
		t.Errorf("create without network: %s", b)
	}
	var n NetworkSpec
	for _, bad := range []string{`3`, `["none"]`, `{"mode":1}`, `{"mode":"rules","alow":["x.org"]}`} {
		if err := json.Unmarshal([]byte(bad), &n); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
