package gvisor

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/evalbox/evalbox/internal/runtime/network"
)

// newNetns creates a network namespace for an outbound sandbox and
// bind-mounts it at path (which must not exist), so that runsc can join
// it by path and the driver can find it again after a restart. In the
// namespace lo is up (runsc copies only interfaces that are up into its
// netstack) and IPv6 is off for interfaces added later, i.e. the
// sandbox's eth0: only the IPv4 path with its NAT and filter rules exists.
// It returns an open handle to the namespace. On error nothing is left.
func newNetns(path string) (netns.NsHandle, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return netns.None(), fmt.Errorf("netns file: %w", err)
	}
	f.Close()
	type result struct {
		ns  netns.NsHandle
		err error
	}
	c := make(chan result, 1)
	go func() {
		// The thread is never unlocked: it ends with this goroutine, and
		// the host process's other threads never see its namespace.
		goruntime.LockOSThread()
		ns, err := setupNetns(path)
		c <- result{ns, err}
	}()
	res := <-c
	if res.err != nil {
		return netns.None(), errors.Join(res.err, removeNetns(path))
	}
	return res.ns, nil
}

// setupNetns runs on a locked thread that it moves into a new network
// namespace.
func setupNetns(path string) (netns.NsHandle, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return netns.None(), fmt.Errorf("unshare netns: %w", err)
	}
	if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
		return netns.None(), fmt.Errorf("bind-mount netns: %w", err)
	}
	// /proc/sys/net resolves to the opener's network namespace.
	if err := writeSysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"); err != nil && !errors.Is(err, unix.ENOENT) {
		return netns.None(), fmt.Errorf("disable ipv6: %w", err)
	}
	if err := network.LoopbackUp(); err != nil {
		return netns.None(), err
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("open netns: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// removeNetns unmounts and removes a netns file made by newNetns; a
// missing file is not an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func writeSysctl(p, v string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(v))
	return err
}
