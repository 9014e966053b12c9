package main

// The CNI protocol as far as this plugin speaks it (specification 1.0 and
// 1.1): the environment, the network configuration, errors and results.
// It is the CNI library's skel and types, less what the plugin never uses
// (results of older versions and their conversions, the IPAM and DNS
// types, the netns package, regular expressions, the reflection of its
// argument parser): the plugin runs once per pod, often a hundred at once,
// and those packages' initialization and pages were most of what an exec
// cost beyond a plugin that does nothing (docs/performance.md, "CNI ADD").
// What it accepts and refuses, and the codes and texts of its errors, are
// the library's (TestDispatch, TestLoadArgs, TestPrevResultAsLibrary) but
// for CNI_NETNS the plugin's own network namespace: an ADD is refused
// before it runs (the library checked after), a DEL runs (the library ran
// it, then failed it).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unicode"
)

// The specification's error codes the plugin returns.
const (
	errIncompatibleCNIVersion      = 1
	errUnknownContainer            = 3
	errInvalidEnvironmentVariables = 4
	errIOFailure                   = 5
	errDecodingFailure             = 6
	errInvalidNetworkConfig        = 7
	errInvalidNetNS                = 8
	errTryAgainLater               = 11
	errInternal                    = 999
)

// pluginError is a CNI error, printed as the plugin's result.
type pluginError struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

func newError(code uint, msg, details string) *pluginError {
	return &pluginError{Code: code, Msg: msg, Details: details}
}

func (e *pluginError) Error() string {
	if e.Details == "" {
		return e.Msg
	}
	return e.Msg + "; " + e.Details
}

// supportedVersions are the specification versions the plugin speaks;
// currentVersion the latest, which VERSION names.
var supportedVersions = []string{"1.0.0", "1.1.0"}

const currentVersion = "1.1.0"

// cmdArgs are a command's environment and its network configuration.
type cmdArgs struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// handlers are the plugin's commands.
type handlers struct {
	Add, Del, Check, Status, GC func(*cmdArgs) error
}

// pluginMain runs the command CNI_COMMAND names and exits, with its error
// (as JSON on stdout) and status 1 if it failed.
func pluginMain(h handlers, about string) {
	if err := dispatch(h, about, os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		printJSON(os.Stdout, err)
		os.Exit(1)
	}
}

// required says which commands need an environment variable.
var required = map[string][]string{
	"CNI_COMMAND":     {"ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION"},
	"CNI_CONTAINERID": {"ADD", "CHECK", "DEL"},
	"CNI_NETNS":       {"ADD", "CHECK"},
	"CNI_IFNAME":      {"ADD", "CHECK", "DEL"},
	"CNI_PATH":        {"ADD", "CHECK", "DEL", "GC", "STATUS"},
}

// envOrder is the order in which missing variables are named.
var envOrder = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

func dispatch(h handlers, about string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) *pluginError {
	cmd := getenv("CNI_COMMAND")
	var missing []string
	for _, name := range envOrder {
		needed := name == "CNI_COMMAND"
		for _, c := range required[name] {
			needed = needed || c == cmd
		}
		v := getenv(name)
		if v == "" {
			if needed {
				missing = append(missing, name)
			}
			continue
		}
		if !needed {
			continue
		}
		var err *pluginError
		switch name {
		case "CNI_CONTAINERID":
			err = validateContainerID(v)
		case "CNI_IFNAME":
			err = validateInterfaceName(v)
		}
		if err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		if cmd == "" && about != "" {
			fmt.Fprintln(stderr, about)
			fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(supportedVersions, ", "))
			return nil
		}
		return newError(errInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	if cmd == "VERSION" {
		if err := json.NewEncoder(stdout).Encode(struct {
			CNIVersion        string   `json:"cniVersion"`
			SupportedVersions []string `json:"supportedVersions,omitempty"`
		}{currentVersion, supportedVersions}); err != nil {
			return newError(errIOFailure, err.Error(), "")
		}
		return nil
	}
	stdinData, err := io.ReadAll(stdin)
	if err != nil {
		return newError(errIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	args := &cmdArgs{
		ContainerID: getenv("CNI_CONTAINERID"), Netns: getenv("CNI_NETNS"), IfName: getenv("CNI_IFNAME"),
		Args: getenv("CNI_ARGS"), Path: getenv("CNI_PATH"), NetnsOverride: getenv("CNI_NETNS_OVERRIDE"),
		StdinData: stdinData,
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
	}
	if err := json.Unmarshal(stdinData, &conf); err != nil {
		return newError(errDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
	}
	if conf.Name == "" {
		return newError(errInvalidNetworkConfig, "missing network name", "")
	}
	if !validName(conf.Name) {
		return newError(errInvalidNetworkConfig, "invalid characters found in network name", conf.Name)
	}
	version := conf.CNIVersion
	if version == "" {
		version = "0.1.0"
	}
	var handler func(*cmdArgs) error
	switch cmd {
	case "ADD":
		handler = h.Add
		// Before the command, so that nothing is made: the library
		// checked after.
		if err := checkNotOwnNetns(args); err != nil {
			return err
		}
	case "DEL":
		// Not checked: DEL makes nothing in CNI_NETNS, and the
		// specification asks it to clean up whatever it is given.
		handler = h.Del
	case "CHECK", "GC", "STATUS":
		handler = map[string]func(*cmdArgs) error{"CHECK": h.Check, "GC": h.GC, "STATUS": h.Status}[cmd]
		// CHECK came with 0.4.0, GC and STATUS with 1.1.0. As the
		// library: a version that does not parse is code 6, one before
		// the command's or after every supported one code 1.
		since := [3]int{1, 1, 0}
		if cmd == "CHECK" {
			since = [3]int{0, 4, 0}
		}
		v, err := parseVersion(version)
		if err != nil {
			return newError(errDecodingFailure, err.Error(), "")
		}
		if !atLeast(v, since) {
			return newError(errIncompatibleCNIVersion, "config version does not allow "+cmd, "")
		}
		newest, _ := parseVersion(currentVersion)
		if !atLeast(newest, v) {
			return newError(errIncompatibleCNIVersion, "plugin version does not allow "+cmd, "")
		}
	default:
		return newError(errInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}
	if !supported(version) {
		return newError(errIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("config is %q, plugin supports %q", version, supportedVersions))
	}
	if err := handler(args); err != nil {
		if e, ok := errors.AsType[*pluginError](err); ok {
			return e
		}
		return newError(errInternal, err.Error(), "")
	}
	return nil
}

// parseVersion parses a "MAJOR[.MINOR[.MICRO]]" version as the library
// did, with its errors.
func parseVersion(version string) ([3]int, error) {
	var v [3]int
	parts := strings.Split(version, ".")
	if len(parts) >= 4 {
		return v, fmt.Errorf("invalid version %q: too many parts", version)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return v, fmt.Errorf("failed to convert %s version part %q: %w", [3]string{"major", "minor", "micro"}[i], p, err)
		}
		v[i] = n
	}
	return v, nil
}

// atLeast says whether version a is b or later.
func atLeast(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

func supported(version string) bool {
	for _, v := range supportedVersions {
		if v == version {
			return true
		}
	}
	return false
}

// validName: a container ID or network name starts with a letter or digit,
// followed by letters, digits, '_', '.' and '-'.
func validName(s string) bool {
	for i, c := range []byte(s) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return s != ""
}

func validateContainerID(id string) *pluginError {
	if !validName(id) {
		return newError(errInvalidEnvironmentVariables, "invalid characters in containerID", id)
	}
	return nil
}

// maxInterfaceNameLength is the kernel's IFNAMSIZ less its terminator.
const maxInterfaceNameLength = 15

func validateInterfaceName(name string) *pluginError {
	if len(name) > maxInterfaceNameLength {
		return newError(errInvalidEnvironmentVariables, "interface name is too long",
			fmt.Sprintf("interface name should be less than %d characters", maxInterfaceNameLength+1))
	}
	if name == "." || name == ".." {
		return newError(errInvalidEnvironmentVariables, "interface name is . or ..", "")
	}
	for _, r := range name {
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return newError(errInvalidEnvironmentVariables, "interface name contains / or : or whitespace characters", "")
		}
	}
	return nil
}

// checkNotOwnNetns refuses a CNI_NETNS that is the plugin's own network
// namespace (unless CNI_NETNS_OVERRIDE says to go on): the pod's
// interface would be the host's. A path that is not a namespace is left
// to the agent, which says what it is.
func checkNotOwnNetns(args *cmdArgs) *pluginError {
	if args.NetnsOverride == "1" || strings.ToUpper(args.NetnsOverride) == "TRUE" || args.Netns == "" {
		return nil
	}
	var pod, own syscall.Stat_t
	if syscall.Stat(args.Netns, &pod) != nil {
		return nil
	}
	if err := syscall.Stat("/proc/thread-self/ns/net", &own); err != nil {
		return newError(errInvalidNetNS, "get plugin's netns failed", "")
	}
	if pod.Dev == own.Dev && pod.Ino == own.Ino {
		return newError(errInvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same", "")
	}
	return nil
}

// printJSON writes v as the library did: indented by four spaces.
func printJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// netConf is the plugin's network configuration.
type netConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	// Socket is the agent's API socket.
	Socket string `json:"socket,omitempty"`
	// PrevResult is CHECK's: the ADD's result.
	PrevResult json.RawMessage `json:"prevResult,omitempty"`
	// ValidAttachments are GC's: what the runtime still uses.
	ValidAttachments []gcAttachment `json:"cni.dev/valid-attachments,omitempty"`
}

type gcAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// prevResult is what CHECK reads of a result: its version and addresses.
type prevResult struct {
	CNIVersion string `json:"cniVersion"`
	IPs        []struct {
		Address string `json:"address"`
	} `json:"ips"`
}

// resultVersions are the result versions a prevResult may have: the
// library read it as a result of the configuration's version, 1.0.0 or
// 1.1.0, which takes these two only (a 0.3.x or 0.4.0 prevResult under a
// 1.x configuration was refused, and is).
var resultVersions = map[string]bool{"1.0.0": true, "1.1.0": true}

// parsePrevResult reads raw, a prevResult of a configuration of version
// confVersion: its addresses. A prevResult without a version has the
// configuration's, as the library gave it.
func parsePrevResult(raw json.RawMessage, confVersion string) ([]netip.Prefix, error) {
	var r prevResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("decoding prevResult: %w", err)
	}
	if r.CNIVersion == "" {
		r.CNIVersion = confVersion
	}
	if !resultVersions[r.CNIVersion] {
		return nil, fmt.Errorf("unsupported CNI result version %q", r.CNIVersion)
	}
	var addrs []netip.Prefix
	for _, ip := range r.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			return nil, fmt.Errorf("prevResult address %q: %w", ip.Address, err)
		}
		addrs = append(addrs, p)
	}
	return addrs, nil
}

// k8sArgs are the CNI_ARGS a kubelet passes; the field names are the keys.
type k8sArgs struct {
	IgnoreUnknown     bool
	K8S_POD_NAMESPACE string
	K8S_POD_NAME      string
	// K8S_POD_UID is sent by containerd and CRI-O, not by every runtime.
	K8S_POD_UID string
}

// loadArgs parses CNI_ARGS, "KEY=VALUE;KEY=VALUE": a key other than
// those of k8sArgs is an error unless IgnoreUnknown is "1" or "true" in
// any case (the library lowercased the value: "True", "TRUE").
func loadArgs(args string) (k8sArgs, error) {
	var k k8sArgs
	if args == "" {
		return k, nil
	}
	var unknown []string
	for _, pair := range strings.Split(args, ";") {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 {
			return k8sArgs{}, fmt.Errorf("ARGS: invalid pair %q", pair)
		}
		switch kv[0] {
		case "IgnoreUnknown":
			switch v := strings.ToLower(kv[1]); v {
			case "1", "true":
				k.IgnoreUnknown = true
			case "0", "false":
				k.IgnoreUnknown = false
			default:
				return k8sArgs{}, fmt.Errorf("ARGS: error parsing value of pair %q: boolean unmarshal error: invalid input %s", pair, v)
			}
		case "K8S_POD_NAMESPACE":
			k.K8S_POD_NAMESPACE = kv[1]
		case "K8S_POD_NAME":
			k.K8S_POD_NAME = kv[1]
		case "K8S_POD_UID":
			k.K8S_POD_UID = kv[1]
		default:
			unknown = append(unknown, pair)
		}
	}
	if len(unknown) > 0 && !k.IgnoreUnknown {
		return k8sArgs{}, fmt.Errorf("ARGS: unknown args %q", unknown)
	}
	return k, nil
}

// result is a CNI 1.0 or 1.1 result, which is the same but for its
// version.
type result struct {
	CNIVersion string         `json:"cniVersion"`
	Interfaces []resultIface  `json:"interfaces,omitempty"`
	IPs        []resultIPConf `json:"ips,omitempty"`
	Routes     []resultRoute  `json:"routes,omitempty"`
}

type resultIface struct {
	Name    string `json:"name"`
	Mac     string `json:"mac,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
}

type resultIPConf struct {
	// Interface indexes Interfaces.
	Interface int    `json:"interface"`
	Address   string `json:"address"`
	Gateway   string `json:"gateway,omitempty"`
}

type resultRoute struct {
	Dst string `json:"dst"`
	GW  string `json:"gw,omitempty"`
}
