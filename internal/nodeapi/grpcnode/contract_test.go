package grpcnode

import (
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/evalbox/evalbox/internal/nodeapi"
	pb "github.com/evalbox/evalbox/internal/nodeapi/nodepb"
)

// TestProtoMirrorsTheContract holds node.proto and nodeapi.Node together:
// every rpc is a method of the interface and every method an rpc, of the
// same name and with the streaming shape the contract's design gives it.
// (The server does not compile without a method per rpc: it embeds
// UnsafeNodeServer.)
func TestProtoMirrorsTheContract(t *testing.T) {
	svc := pb.File_evalbox_node_v1_node_proto.Services().ByName("Node")
	if svc == nil {
		t.Fatal("no service Node in node.proto")
	}
	rpcs := map[string]protoreflect.MethodDescriptor{}
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		rpcs[string(m.Name())] = m
	}
	iface := reflect.TypeFor[nodeapi.Node]()
	var methods []string
	for i := range iface.NumMethod() {
		methods = append(methods, iface.Method(i).Name)
	}
	for _, name := range methods {
		if _, ok := rpcs[name]; !ok {
			t.Errorf("nodeapi.Node.%s has no rpc in node.proto", name)
		}
	}
	for name := range rpcs {
		if !slices.Contains(methods, name) {
			t.Errorf("rpc %s has no method in nodeapi.Node", name)
		}
	}
	// The streams: data in, data out, or both.
	shapes := map[string][2]bool{ // client streams, server streams
		"Wait": {false, true}, "Exec": {true, true}, "AttachProcess": {false, true},
		"WriteFile": {true, false}, "OpenFile": {false, true}, "ConnectPort": {true, true},
		"WatchDir": {false, true},
	}
	for name, m := range rpcs {
		want := shapes[name]
		if got := [2]bool{m.IsStreamingClient(), m.IsStreamingServer()}; got != want {
			t.Errorf("rpc %s streams (client, server) = %v, want %v", name, got, want)
		}
	}
}
