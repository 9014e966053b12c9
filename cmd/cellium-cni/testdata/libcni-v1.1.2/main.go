// Command libcni112 drives a CNI plugin as a runtime linking libcni v1.1.2
// does (containerd 1.7): it reads the network configuration list, then
// runs ADD, CHECK and DEL of one container, and prints what happened as a
// JSON object on stdout. It exits 0 whatever the plugin answers; it fails
// only on bad arguments.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/containernetworking/cni/libcni"
)

// report is what the run prints: an empty error is success.
type report struct {
	// ListVersion is the version the library took from the list.
	ListVersion string          `json:"listVersion"`
	ListError   string          `json:"listError,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	AddError    string          `json:"addError,omitempty"`
	CheckError  string          `json:"checkError,omitempty"`
	DelError    string          `json:"delError,omitempty"`
}

func main() {
	conf := flag.String("conf", "", "network configuration list file")
	bin := flag.String("bin", "", "CNI bin directory")
	cache := flag.String("cache", "", "the library's cache directory")
	id := flag.String("id", "", "container ID")
	netns := flag.String("netns", "", "container network namespace path")
	flag.Parse()
	if *conf == "" || *bin == "" || *cache == "" || *id == "" || *netns == "" {
		fmt.Fprintln(os.Stderr, "usage: libcni112 -conf FILE -bin DIR -cache DIR -id ID -netns PATH")
		os.Exit(2)
	}
	var r report
	defer func() { json.NewEncoder(os.Stdout).Encode(r) }()
	list, err := libcni.ConfListFromFile(*conf)
	if err != nil {
		r.ListError = err.Error()
		return
	}
	r.ListVersion = list.CNIVersion
	cni := libcni.NewCNIConfigWithCacheDir([]string{*bin}, *cache, nil)
	rt := &libcni.RuntimeConf{ContainerID: *id, NetNS: *netns, IfName: "eth0"}
	ctx := context.Background()
	res, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		r.AddError = err.Error()
		return
	}
	var buf bytes.Buffer
	if err := res.PrintTo(&buf); err != nil {
		r.AddError = "print the result: " + err.Error()
		return
	}
	r.Result = buf.Bytes()
	if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
		r.CheckError = err.Error()
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		r.DelError = err.Error()
	}
}
