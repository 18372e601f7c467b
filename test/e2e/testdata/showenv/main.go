// Command showenv prints what an imported image's process sees: its user
// id, working directory and environment, one KEY=VALUE per line. It is
// built static into the test images of the OCI import tests.
package main

import (
	"fmt"
	"os"
	"sort"
)

func main() {
	wd, _ := os.Getwd()
	fmt.Printf("uid=%d\nwd=%s\n", os.Getuid(), wd)
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Println(kv)
	}
}
