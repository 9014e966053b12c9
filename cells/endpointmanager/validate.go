package endpointmanager

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"

	"github.com/cellium/cellium/cells/devices"
)

// containerIDRE is what the CNI specification allows in a container ID.
var containerIDRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// maxContainerIDLen bounds a container ID: runtimes use 64 hex digits.
const maxContainerIDLen = 256

func validContainerID(id string) error {
	if len(id) > maxContainerIDLen || !containerIDRE.MatchString(id) {
		return fmt.Errorf("invalid container ID %q: want letters, digits, '_', '.' and '-', starting with a letter or digit, at most %d characters", id, maxContainerIDLen)
	}
	return nil
}

func validNetns(path string) error {
	if path == "" || !filepath.IsAbs(path) {
		return fmt.Errorf("invalid netns %q: want the absolute path of the container's network namespace, e.g. /var/run/netns/cni-1234", path)
	}
	return nil
}

// validIfName is what the kernel accepts as an interface name.
func validIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." || strings.ContainsAny(name, "/:") || strings.ContainsFunc(name, unicode.IsSpace) {
		return fmt.Errorf("invalid interface name %q: want 1 to 15 characters without '/', ':' or spaces, e.g. eth0", name)
	}
	return nil
}

// HostIfName is the name of the host side of a container's veth pair:
// devices.EndpointHostPrefix ("lxc") and the first 12 hex digits of the SHA-256 of the container ID, so
// that it is known from the container ID alone, also when the agent died
// before it wrote down the endpoint.
func HostIfName(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return devices.EndpointHostPrefix + hex.EncodeToString(sum[:])[:12]
}
