// Command evalbox-nsinit is the init stage of a namespaces sandbox: the
// namespaces runtime starts it, instead of re-executing evalbox itself,
// in the sandbox's new namespaces, where it sets the sandbox up and execs
// the agent (namespaces.Init). It imports only that package, so that it
// starts fast: it runs once per sandbox start.
package main

import (
	"fmt"
	"os"

	"github.com/evalbox/evalbox/internal/runtime/namespaces"
)

func main() {
	namespaces.Init() // does not return in an init stage
	fmt.Fprintln(os.Stderr, "evalbox-nsinit: the namespaces runtime runs this as a sandbox's init stage; it is not run by hand")
	os.Exit(2)
}
